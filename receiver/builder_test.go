package receiver

import "time"

// forgettingBuilder is a Builder that keeps per-app state and scratch directories, recording
// what the pipeline asks it to forget or clean (buildpack.Local does it for real; its own
// tests check the directories).
type forgettingBuilder struct {
	builderFunc
	forgot  []string
	cleaned []time.Time
}

func (b *forgettingBuilder) ForgetApp(app string) error { b.forgot = append(b.forgot, app); return nil }
func (b *forgettingBuilder) RemoveLeftovers(before time.Time) ([]string, error) {
	b.cleaned = append(b.cleaned, before)
	return nil, nil
}

var _ interface {
	Builder
	AppForgetter
	LeftoverRemover
} = (*forgettingBuilder)(nil)
