package segment

import "testing"

// A write buffer over maxFreeBuf comes from its capacity class: at least
// the size asked for, under twice it, and one of the class sizes, so it
// goes back to its pool when released (another size would be dropped).
func TestBigBufClasses(t *testing.T) {
	for _, n := range []int{maxFreeBuf + 1, 2 * maxFreeBuf, 2*maxFreeBuf + 1, 3 << 20, 4 << 20, 5<<20 + 7, maxPending, bigClassSize(bigClasses - 1)} {
		b := newBuf(n)
		if len(b) != 0 || cap(b) < n || cap(b) > n+n/4 {
			t.Errorf("newBuf(%d): len %d cap %d, want 0 and [%d, %d]", n, len(b), cap(b), n, n+n/4)
		}
		k := bigClass(n)
		if k < 0 || k >= bigClasses || bigClassSize(k) != cap(b) {
			t.Errorf("newBuf(%d): cap %d, class %d (%d bytes)", n, cap(b), k, bigClassSize(k))
		}
	}
	if b := newBuf(bigClassSize(bigClasses-1) + 1); cap(b) != bigClassSize(bigClasses-1)+1 {
		t.Errorf("over the largest class: cap %d, want exactly the size asked for", cap(b))
	}
	if b := newBuf(minBuf); cap(b) != minBuf {
		t.Errorf("newBuf(%d): cap %d", minBuf, cap(b))
	}
	for _, n := range []int{bigMin + 1, 300 << 10, 600 << 10, 1 << 20, 3 << 20} {
		b := LargeBuf(n)
		if len(b) != 0 || cap(b) < n || cap(b) > n+n/4 || !PutLargeBuf(b) {
			t.Errorf("LargeBuf(%d): len %d cap %d, or not taken back", n, len(b), cap(b))
		}
	}
	if b := LargeBuf(bigMin); cap(b) != bigMin {
		t.Errorf("LargeBuf(%d): cap %d, want exactly that", bigMin, cap(b))
	}
	for k := 1; k < bigClasses; k++ {
		if a, b := bigClassSize(k-1), bigClassSize(k); b <= a || b > a+a/4+1 || b%(64<<10) != 0 || bigClass(b) != k || bigClass(a+1) != k {
			t.Errorf("class %d: %d bytes after %d", k, b, a)
		}
	}
	if PutLargeBuf(make([]byte, 0, 3<<20+1)) {
		t.Error("PutLargeBuf took a buffer whose capacity is no class size")
	}
}

// A released big buffer is reused whole (its capacity restored from its
// class): what the next group commit writes is exactly what it encoded,
// not what the buffer held before. Reuse itself is up to the pool (it
// may drop anything at a garbage collection), so only the contents are
// checked.
func TestBigBufReuse(t *testing.T) {
	l := &Log{}
	for i := range 4 {
		b := newBuf(3 << 20)
		if len(b) != 0 || cap(b) != bigClassSize(bigClass(3<<20)) {
			t.Fatalf("round %d: len %d cap %d", i, len(b), cap(b))
		}
		for j := 0; j < 3<<20; j++ {
			b = append(b, byte(i))
		}
		for j, c := range b {
			if c != byte(i) {
				t.Fatalf("round %d: byte %d is %d", i, j, c)
			}
		}
		l.releaseBuf(b)
	}
	if len(l.freeBufs) != 0 {
		t.Fatalf("a big buffer went to the small free list")
	}
	l.releaseBuf(make([]byte, 0, minBuf))
	if len(l.freeBufs) != 1 {
		t.Fatalf("a small buffer did not go to the free list")
	}
}
