package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"syscall"

	"github.com/google/renameio/v2"
)

// RangeSize is how many host ids one sandbox range holds (ids 0..65535 inside).
const RangeSize = 1 << 16

// FirstHostID is where kpush's ranges start on the host: far above the ids of people and
// system accounts (and of /etc/subuid's usual 100000+ ranges), below 2^31 for tools that
// treat ids as signed.
const FirstHostID = 1_000_000_000

// maxRanges keeps every range below 2^31.
const maxRanges = (1<<31 - FirstHostID) / RangeSize

// IDRange is a block of RangeSize host ids: id n inside a sandbox is Base+n on the host.
type IDRange struct {
	Base uint32
}

// Host returns the host id of id inside the range.
func (r IDRange) Host(id uint32) uint32 { return r.Base + id }

func (r IDRange) valid(uid, gid uint32) error {
	if r.Base < FirstHostID {
		return fmt.Errorf("sandbox: host id range %d is not one of kpush's (allocate it with Ranges.Get)", r.Base)
	}
	if uid >= RangeSize || gid >= RangeSize {
		return fmt.Errorf("sandbox: uid %d / gid %d is outside the sandbox's %d ids", uid, gid, RangeSize)
	}
	return nil
}

// rangeKey is what a range is allocated for: "app/NAME" or "build/NAME".
var rangeKey = regexp.MustCompile(`^[a-z]+/[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// Ranges hands out host id ranges, one per key, kept in a file so that an app's files keep
// their owner across restarts. Safe for concurrent use, also by several processes sharing
// the file (flock).
type Ranges struct {
	// File is the JSON file ({"key": index}) the allocation lives in. Required.
	File string
}

// Get returns key's range, allocating the next free one on first use.
func (r *Ranges) Get(key string) (IDRange, error) {
	if !rangeKey.MatchString(key) {
		return IDRange{}, fmt.Errorf("sandbox: id range key %q is invalid", key)
	}
	if err := os.MkdirAll(filepath.Dir(r.File), 0o700); err != nil {
		return IDRange{}, fmt.Errorf("sandbox: %w", err)
	}
	lock, err := os.OpenFile(r.File+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return IDRange{}, fmt.Errorf("sandbox: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return IDRange{}, fmt.Errorf("sandbox: locking %s: %w", r.File, err)
	}
	m := map[string]int{}
	b, err := os.ReadFile(r.File)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return IDRange{}, fmt.Errorf("sandbox: %w", err)
	default:
		if err := json.Unmarshal(b, &m); err != nil {
			return IDRange{}, fmt.Errorf("sandbox: %s is corrupt: %w", r.File, err)
		}
	}
	if i, ok := m[key]; ok && i >= 0 && i < maxRanges {
		return IDRange{Base: FirstHostID + uint32(i)*RangeSize}, nil
	}
	used := make(map[int]bool, len(m))
	for _, i := range m {
		used[i] = true
	}
	next := -1
	for i := 0; i < maxRanges; i++ {
		if !used[i] {
			next = i
			break
		}
	}
	if next < 0 {
		return IDRange{}, fmt.Errorf("sandbox: all %d host id ranges are taken", maxRanges)
	}
	m[key] = next
	out, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return IDRange{}, err
	}
	if err := renameio.WriteFile(r.File, out, 0o600); err != nil {
		return IDRange{}, fmt.Errorf("sandbox: saving %s: %w", r.File, err)
	}
	return IDRange{Base: FirstHostID + uint32(next)*RangeSize}, nil
}
