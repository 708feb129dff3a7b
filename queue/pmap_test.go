package queue

import (
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// TestPmapMatchesMap: random sets and deletes agree with a Go map, with
// good hashes and with hashes that collide in their low bits or entirely
// (so deep paths and collision nodes are exercised); every older version
// keeps its contents. Changes are made persistently (a nil pedit), and in
// batches (a pedit, replaced each time a version is kept, as Routes.Table
// does): a kept version is never changed in place.
func TestPmapMatchesMap(t *testing.T) {
	for _, batched := range []bool{false, true} {
		testPmapMatchesMap(t, batched)
	}
}

func testPmapMatchesMap(t *testing.T, batched bool) {
	steps := 3000
	if raceEnabled {
		steps = 1000
	}
	for _, hf := range []struct {
		name string
		hash func(string) uint64
	}{
		{"hashName", hashName},
		{"xxhash", xxhash.Sum64String},
		{"high bits only", func(s string) uint64 { return xxhash.Sum64String(s) &^ (1<<40 - 1) }},
		{"8 values", func(s string) uint64 { return xxhash.Sum64String(s) % 8 << 61 }},
		{"constant", func(string) uint64 { return 42 }},
	} {
		r := rand.New(rand.NewPCG(1, 2))
		var m pmap[string, int]
		var ed *pedit
		if batched {
			ed = &pedit{}
		}
		want := map[string]int{}
		type version struct {
			m    pmap[string, int]
			want map[string]int
		}
		var versions []version
		check := func(v version) {
			t.Helper()
			if v.m.len() != len(v.want) {
				t.Fatalf("%s: len %d, want %d", hf.name, v.m.len(), len(v.want))
			}
			for i := 0; i < 64; i++ {
				k := strconv.Itoa(i)
				got, ok := v.m.get(hf.hash(k), k)
				w, wok := v.want[k]
				if ok != wok || got != w {
					t.Fatalf("%s: get %s = %d %v, want %d %v", hf.name, k, got, ok, w, wok)
				}
				if got, ok := pmapGetBytes(v.m, hf.hash(k), []byte(k)); ok != wok || got != w {
					t.Fatalf("%s: getBytes %s = %d %v, want %d %v", hf.name, k, got, ok, w, wok)
				}
			}
			n := 0
			v.m.all(func(k string, val int) {
				n++
				if v.want[k] != val {
					t.Fatalf("%s: all gave %s=%d, want %d", hf.name, k, val, v.want[k])
				}
			})
			if n != len(v.want) {
				t.Fatalf("%s: all gave %d entries, want %d", hf.name, n, len(v.want))
			}
		}
		for step := 0; step < steps; step++ {
			k := strconv.Itoa(r.IntN(64))
			if r.IntN(3) == 0 {
				m = m.del(ed, hf.hash(k), k)
				delete(want, k)
			} else {
				v := r.IntN(1000)
				m = m.set(ed, hf.hash(k), k, v)
				want[k] = v
			}
			check(version{m, want})
			if step%50 == 0 {
				c := make(map[string]int, len(want))
				for k, v := range want {
					c[k] = v
				}
				versions = append(versions, version{m, c})
				if batched {
					ed = &pedit{} // m is kept: later changes copy its nodes
				}
			}
		}
		for _, v := range versions {
			check(v)
		}
	}
}
