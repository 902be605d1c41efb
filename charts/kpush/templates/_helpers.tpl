{{/* Full name of the release's objects: the release name, with "-kpush" unless it contains it. */}}
{{- define "kpush.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kpush.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kpush.labels" -}}
{{ include "kpush.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "kpush.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kpush.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "kpush.hostKeySecretName" -}}
{{- default (printf "%s-ssh-host-key" (include "kpush.fullname" .)) .Values.ssh.hostKey.existingSecret -}}
{{- end -}}

{{/* The namespaces apps go to, as a list: apps.namespaces, else the release namespace. */}}
{{- define "kpush.appNamespaces" -}}
{{- if .Values.apps.namespaces -}}
{{- toJson (uniq .Values.apps.namespaces) -}}
{{- else -}}
{{- toJson (list .Release.Namespace) -}}
{{- end -}}
{{- end -}}

{{- define "kpush.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The build Pods' labels as a LabelSelector: what buildpack.BuildPod sets (LabelManagedBy,
LabelBuild); kpush's own Pod has app.kubernetes.io/managed-by=Helm. */}}
{{- define "kpush.buildPodSelector" -}}
matchLabels:
  app.kubernetes.io/managed-by: kpush
matchExpressions:
  - {key: kpush.dev/build, operator: Exists}
{{- end -}}

{{/* An egress rule from {to, ports}: empty `to` is any destination on those ports. */}}
{{- define "kpush.egressRule" -}}
- ports:
    {{- toYaml .ports | nindent 4 }}
  {{- with .to }}
  to:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}
