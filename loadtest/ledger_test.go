package loadtest

import "testing"

func TestRanges(t *testing.T) {
	in := map[uint64]bool{1: true, 2: true, 3: true, 5: true, 7: true, 8: true}
	s := formatRanges(9, func(x uint64) bool { return in[x] })
	if s != "1-3,5,7-8" {
		t.Fatalf("formatRanges: %q", s)
	}
	r, err := parseRanges(s)
	if err != nil {
		t.Fatal(err)
	}
	for x := uint64(0); x <= 9; x++ {
		if r.has(x) != in[x] {
			t.Errorf("parseRanges(%q).has(%d) = %v", s, x, r.has(x))
		}
	}
	for _, bad := range []string{"0-2", "3-1", "1-3,2", "x", "1,,2"} {
		if _, err := parseRanges(bad); err == nil {
			t.Errorf("parseRanges(%q) accepted", bad)
		}
	}
}
