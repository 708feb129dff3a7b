package segment

import (
	"sync"

	"golang.org/x/sys/unix"
)

// mapper is implemented by files that can be mapped read-only. A mapping
// is never written through and the mapped file is never shrunk while it is
// mapped (recovery truncates before anything is mapped).
type mapper interface {
	// Map maps the first size bytes; unmap releases them.
	Map(size int64) (data []byte, unmap func() error, err error)
}

func (o osFile) Map(size int64) ([]byte, func() error, error) {
	b, err := unix.Mmap(int(o.f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, nil, err
	}
	return b, func() error { return unix.Munmap(b) }, nil
}

// Map on a MemFS file returns a snapshot of what is written now (MemFS has
// no page cache to share), so it never covers more than that: a later read
// past it remaps.
func (h *memHandle) Map(int64) ([]byte, func() error, error) {
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	return append([]byte(nil), h.f.data...), func() error { return nil }, nil
}

// mapping is one read-only mapping of the log file, reference-counted:
// it is unmapped when it is no longer current and its last reader has
// released it.
type mapping struct {
	data  []byte
	unmap func() error
	refs  int
	stale bool
}

type mappings struct {
	mu  sync.Mutex
	cur *mapping
}

// acquire returns a mapping covering at least size bytes, remapping the
// file (larger) when the log has grown past the current one.
func (ms *mappings) acquire(f File, size int64) (*mapping, error) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if ms.cur == nil || int64(len(ms.cur.data)) < size {
		mp, ok := f.(mapper)
		if !ok {
			return nil, errNoMap
		}
		// Map with headroom so a growing log does not remap on every read.
		data, unmap, err := mp.Map(size + size/2 + 1<<20)
		if err != nil {
			// The file may be shorter than the headroom: map exactly.
			if data, unmap, err = mp.Map(size); err != nil {
				return nil, err
			}
		}
		if old := ms.cur; old != nil {
			old.stale = true
			if old.refs == 0 {
				_ = old.unmap()
			}
		}
		ms.cur = &mapping{data: data, unmap: unmap}
	}
	ms.cur.refs++
	return ms.cur, nil
}

func (ms *mappings) release(m *mapping) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	m.refs--
	if m.refs == 0 && m.stale {
		_ = m.unmap()
	}
}

func (ms *mappings) close() {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if ms.cur != nil {
		ms.cur.stale = true
		if ms.cur.refs == 0 {
			_ = ms.cur.unmap()
		}
		ms.cur = nil
	}
}
