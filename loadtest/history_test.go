package loadtest

import "testing"

// TestHistoryCounts: the checker's verdicts: a confirmed message never
// consumed is lost, a second consumption a duplicate, a body never
// published or not as published invented, an unconfirmed one consumed is
// neither lost nor invented.
func TestHistoryCounts(t *testing.T) {
	h := NewHistory(2, 64)
	for s := uint64(1); s <= 10; s++ {
		h.Sent(0, s)
	}
	h.Confirmed(0, 1, 8, true)
	h.Confirmed(0, 9, 9, false)
	for s := uint64(1); s <= 10; s++ {
		if s == 4 || s == 5 {
			continue // lost
		}
		p, seq, ok := h.Check(h.Body(0, s))
		if !ok || p != 0 || seq != s {
			t.Fatalf("Check(%d) = %d %d %v", s, p, seq, ok)
		}
		h.Consumed(p, seq)
	}
	h.Consumed(0, 1) // duplicate
	bad := h.Body(0, 2)
	bad[40] ^= 1
	if _, _, ok := h.Check(bad); ok {
		t.Fatal("a damaged body passed")
	}
	if _, _, ok := h.Check(h.Body(0, 11)); ok { // never sent
		t.Fatal("an unsent sequence number passed")
	}
	if _, _, ok := h.Check(h.Body(1, 1)); ok { // producer 1 sent nothing
		t.Fatal("a message of a producer that sent nothing passed")
	}
	if _, _, ok := h.Check([]byte("short")); ok {
		t.Fatal("a foreign body passed")
	}
	c := h.Counts()
	want := Counts{Published: 10, Confirmed: 8, Nacked: 1, Unknown: 1, Consumed: 8, Deliveries: 9, Lost: 2, Duplicated: 1,
		Invented: 4, NackedSeen: 1, LostRanges: []string{"producer 0: 4-5"}}
	if c.Published != want.Published || c.Confirmed != want.Confirmed || c.Nacked != want.Nacked || c.Unknown != want.Unknown ||
		c.Consumed != want.Consumed || c.Deliveries != want.Deliveries || c.Lost != want.Lost || c.Duplicated != want.Duplicated ||
		c.Invented != want.Invented || c.NackedSeen != want.NackedSeen || len(c.LostRanges) != 1 || c.LostRanges[0] != want.LostRanges[0] {
		t.Fatalf("counts %+v\nwant   %+v", c, want)
	}
	if h.Lost() != 2 {
		t.Fatalf("Lost() = %d", h.Lost())
	}
}
