package receiver

import (
	"context"
	"strconv"

	"kpush.dev/kpush/gitserver"
)

// keepSource makes rel's commit reachable for good in repo as rel.Ref()
// (refs/kpush/releases/v<N>), so that rollback, rebuild and `git clone` find the source of
// every release, also of a push that was rejected (gitserver.Repository.Keep).
func keepSource(ctx context.Context, repo *gitserver.Repository, rel *Release) error {
	return repo.Keep(ctx, rel.Ref(), rel.Commit, "kpush release v"+strconv.Itoa(rel.Version))
}
