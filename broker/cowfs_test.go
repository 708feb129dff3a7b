package broker

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"

	"github.com/warren-mq/warren/segment"
)

// TestCOWFileReadsTheView: every handle of a file in the copy-on-write
// view reads and maps what the view holds, whichever handle changed it:
// a handle opened before another one's first write does not keep reading
// the base file (stale bytes), nor map it past its end (a SIGBUS where
// the view grew), and a second writer does not copy the base over the
// first one's changes. The base file is never written.
func TestCOWFileReadsTheView(t *testing.T) {
	name, base := cowBaseFile(t)
	v := newCOWFS(segment.OSFS{})
	open := func() segment.File {
		t.Helper()
		f, err := v.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = f.Close() })
		return f
	}
	reader, w1, w2 := open(), open(), open()
	want := append([]byte(nil), base...)
	write := func(f segment.File, p []byte, off int64) {
		t.Helper()
		if _, err := f.WriteAt(p, off); err != nil {
			t.Fatal(err)
		}
		if end := off + int64(len(p)); end > int64(len(want)) {
			want = append(want, make([]byte, end-int64(len(want)))...)
		}
		copy(want[off:], p)
	}
	write(w1, bytes.Repeat([]byte{'b'}, 5000), 50) // past the base's end, and its first page
	write(w2, []byte("cc"), 10)                    // a second handle's first write

	for i, f := range []segment.File{reader, w1, w2} {
		if size, err := f.Size(); err != nil || size != int64(len(want)) {
			t.Fatalf("handle %d: size %d (%v), want %d", i, size, err, len(want))
		}
		got := make([]byte, len(want))
		if n, err := f.ReadAt(got, 0); n != len(want) {
			t.Fatalf("handle %d: read %d bytes: %v", i, n, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("handle %d reads other bytes than the view holds", i)
		}
		mapped := mapAll(t, f.(fileMapper), int64(len(want)))
		if !bytes.Equal(mapped, want) {
			t.Fatalf("handle %d maps other bytes than the view holds", i)
		}
	}
	if got, err := os.ReadFile(name); err != nil || !bytes.Equal(got, base) {
		t.Fatalf("the base file changed (%v)", err)
	}
}

// TestCOWFileMapsBaseWithinItsEnd: a file the view has not changed is
// mapped from the base (not copied), but never past the base's end, which
// a read of the mapping would take as a SIGBUS: the mapping is shorter
// than asked for, which segment's reader remaps past (as MemFS's is).
func TestCOWFileMapsBaseWithinItsEnd(t *testing.T) {
	name, base := cowBaseFile(t)
	f, err := newCOWFS(segment.OSFS{}).Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	data, unmap, err := f.(fileMapper).Map(3 << 20) // with segment's headroom
	if err != nil {
		t.Fatal(err)
	}
	defer unmap()
	if !bytes.Equal(data, base) {
		t.Fatalf("mapped %d bytes, want the base's %d", len(data), len(base))
	}
}

// mapAll maps f's first size bytes and returns a copy of them; a fault
// reading the mapping (a SIGBUS: mapped past a file's end) fails the test
// instead of killing it.
func mapAll(t *testing.T, f fileMapper, size int64) (out []byte) {
	t.Helper()
	data, unmap, err := f.Map(size)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = unmap() }()
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("reading the mapping faulted: %v", r)
		}
	}()
	if int64(len(data)) < size {
		t.Fatalf("mapped %d bytes, want %d", len(data), size)
	}
	return append([]byte(nil), data[:size]...)
}

// TestCOWFileRemovedStaysRemoved: a handle still open on a base file the
// view removed keeps what it had, as an unlinked file's does, and may be
// written; that write does not bring the file back into the view (it
// used to: its copy was made under the file's name), nor reach a file
// created in the view under that name since.
func TestCOWFileRemovedStaysRemoved(t *testing.T) {
	name, base := cowBaseFile(t)
	v := newCOWFS(segment.OSFS{})
	h, err := v.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = h.Close() }()
	if err := v.Remove(name); err != nil {
		t.Fatal(err)
	}
	if _, err := h.WriteAt([]byte("bb"), 10); err != nil {
		t.Fatal(err)
	}
	if names, err := v.List(filepath.Dir(name)); err != nil || len(names) != 0 {
		t.Fatalf("the view lists %v (%v) after the removal and a write through an open handle, want nothing", names, err)
	}
	n, err := v.Open(name) // a new file of that name
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = n.Close() }()
	if size, err := n.Size(); err != nil || size != 0 {
		t.Fatalf("a file created in the view after the removal holds %d bytes (%v), want 0", size, err)
	}
	if _, err := h.WriteAt([]byte("cc"), 20); err != nil {
		t.Fatal(err)
	}
	if size, err := n.Size(); err != nil || size != 0 {
		t.Fatalf("the new file holds %d bytes (%v) after a write through the removed one's handle, want 0", size, err)
	}
	want := append([]byte(nil), base...)
	copy(want[10:], "bb")
	copy(want[20:], "cc")
	got := make([]byte, len(want))
	if k, err := h.ReadAt(got, 0); k != len(want) || !bytes.Equal(got, want) {
		t.Fatalf("the removed file's handle reads %q (%v), want %q", got[:k], err, want)
	}
	if got, err := os.ReadFile(name); err != nil || !bytes.Equal(got, base) {
		t.Fatalf("the base file changed (%v)", err)
	}
}

// cowBaseFile writes a 100-byte base file of 'a's on disk for a
// copy-on-write view over it, and returns its name and bytes.
func cowBaseFile(t *testing.T) (string, []byte) {
	t.Helper()
	name := filepath.Join(t.TempDir(), "f")
	base := bytes.Repeat([]byte{'a'}, 100)
	if err := os.WriteFile(name, base, 0o600); err != nil {
		t.Fatal(err)
	}
	return name, base
}
