package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/gofrs/flock"

	"kpush.dev/kpush/internal/atomicfile"
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

// HostRangesFile is where kpush records, for the whole host, which id range it gave to which
// key of which data dir: so that two kpush processes with different data dirs (or tests)
// never give two apps the same host ids.
var HostRangesFile = "/var/lib/kpush/sandbox-ids.json"

// Ranges hands out host id ranges, one per key of one data dir, recorded host-wide in File so
// that an app's files keep their owner across restarts and no two apps on the host, of any
// data dir, share ids. Ranges listed in /etc/subuid or /etc/subgid (other users' containers)
// are never handed out. Safe for concurrent use, also by several processes (flock).
type Ranges struct {
	// File is the host-wide allocation (JSON). Empty: HostRangesFile.
	File string
	// Owner is the data dir the keys belong to (an absolute path). Required. An entry whose
	// owner no longer exists is forgotten at the next allocation.
	Owner string
}

// NewRanges returns the host-wide ranges of the data dir owner.
func NewRanges(owner string) *Ranges { return &Ranges{Owner: owner} }

type rangeEntry struct {
	Owner string `json:"owner"`
	Key   string `json:"key"`
	Index int    `json:"index"`
}

// Get returns key's range, allocating the next free one on first use.
func (r *Ranges) Get(key string) (IDRange, error) {
	var got IDRange
	err := r.update(key, func(st *rangeFile) (bool, error) {
		used := map[int]bool{}
		for _, e := range st.Ranges {
			if e.Owner == r.Owner && e.Key == key {
				got = indexRange(e.Index)
				return false, nil
			}
			used[e.Index] = true
		}
		// Hand out ranges in turn, from where the last one was: a range freed a moment ago
		// (its processes may not all have exited) comes back only after every other one.
		taken := subordinateRanges()
		next := -1
		for n := 0; n < maxRanges && next < 0; n++ {
			i := (st.Next + n) % maxRanges
			if !used[i] && !overlaps(indexRange(i), taken) {
				next = i
			}
		}
		if next < 0 {
			return false, fmt.Errorf("sandbox: all %d host id ranges are taken", maxRanges)
		}
		st.Ranges = append(st.Ranges, rangeEntry{Owner: r.Owner, Key: key, Index: next})
		st.Next = (next + 1) % maxRanges
		got = indexRange(next)
		return true, nil
	})
	return got, err
}

// Release forgets key's range (an app destroyed): it is handed out again after every other.
func (r *Ranges) Release(key string) error {
	return r.update(key, func(st *rangeFile) (bool, error) {
		for i, e := range st.Ranges {
			if e.Owner == r.Owner && e.Key == key {
				st.Ranges = append(st.Ranges[:i], st.Ranges[i+1:]...)
				return true, nil
			}
		}
		return false, nil
	})
}

// update runs fn on the allocation file under its lock, with the entries of data dirs that
// are gone (and invalid ones) already dropped, and saves it when fn says it changed.
func (r *Ranges) update(key string, fn func(*rangeFile) (bool, error)) error {
	if !rangeKey.MatchString(key) {
		return fmt.Errorf("sandbox: id range key %q is invalid", key)
	}
	if !filepath.IsAbs(r.Owner) {
		return fmt.Errorf("sandbox: id ranges need the data dir's absolute path, not %q", r.Owner)
	}
	file := r.File
	if file == "" {
		file = HostRangesFile
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}
	lock := flock.New(file + ".lock")
	if err := lock.Lock(); err != nil {
		return fmt.Errorf("sandbox: locking %s: %w", file, err)
	}
	defer lock.Unlock() //nolint:errcheck // closing drops it anyway
	var st rangeFile
	b, err := os.ReadFile(file)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return fmt.Errorf("sandbox: %w", err)
	default:
		if err := json.Unmarshal(b, &st); err != nil {
			return fmt.Errorf("sandbox: %s is corrupt: %w", file, err)
		}
	}
	n := len(st.Ranges)
	kept := st.Ranges[:0]
	for _, e := range st.Ranges {
		if e.Index < 0 || e.Index >= maxRanges {
			continue
		}
		if _, err := os.Stat(e.Owner); errors.Is(err, os.ErrNotExist) {
			continue // its data dir is gone: so are its files
		}
		kept = append(kept, e)
	}
	st.Ranges = kept
	changed, err := fn(&st)
	if err != nil || (!changed && len(kept) == n) {
		return err
	}
	out, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(file, out, 0o600); err != nil {
		return fmt.Errorf("sandbox: saving %s: %w", file, err)
	}
	return nil
}

// rangeFile is HostRangesFile's content.
type rangeFile struct {
	Next   int          `json:"next"` // where the next allocation starts looking
	Ranges []rangeEntry `json:"ranges"`
}

func indexRange(i int) IDRange { return IDRange{Base: FirstHostID + uint32(i)*RangeSize} }

// subordinateRanges are the host id ranges /etc/subuid and /etc/subgid give to users
// ("name:start:count" lines), which their own containers use.
func subordinateRanges() [][2]uint64 {
	var out [][2]uint64
	for _, f := range subIDFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			p := strings.Split(strings.TrimSpace(line), ":")
			if len(p) != 3 {
				continue
			}
			start, err1 := strconv.ParseUint(p[1], 10, 32)
			n, err2 := strconv.ParseUint(p[2], 10, 32)
			if err1 == nil && err2 == nil && n > 0 {
				out = append(out, [2]uint64{start, start + n})
			}
		}
	}
	return out
}

// subIDFiles are the subordinate id files of the host (a variable for tests).
var subIDFiles = []string{"/etc/subuid", "/etc/subgid"}

func overlaps(r IDRange, taken [][2]uint64) bool {
	lo, hi := uint64(r.Base), uint64(r.Base)+RangeSize
	for _, t := range taken {
		if lo < t[1] && t[0] < hi {
			return true
		}
	}
	return false
}
