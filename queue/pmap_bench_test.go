package queue

import (
	"strconv"
	"testing"
)

// BenchmarkPmapGet: a lookup by bytes in a pmap of 100 and 100,000
// string keys, against a Go map (what the compiled table uses).
func BenchmarkPmapGet(b *testing.B) {
	for _, n := range []int{100, 100_000} {
		var m pmap[string, int]
		gm := map[string]int{}
		for i := 0; i < n; i++ {
			k := "key-" + strconv.Itoa(i)
			m = m.set(nil, hashName(k), k, i)
			gm[k] = i
		}
		key := []byte("key-42")
		b.Run("n="+strconv.Itoa(n)+"/impl=pmap", func(b *testing.B) {
			for b.Loop() {
				if v, _ := pmapGetBytes(m, hashBytes(key), key); v != 42 {
					b.Fatal(v)
				}
			}
		})
		b.Run("n="+strconv.Itoa(n)+"/impl=gomap", func(b *testing.B) {
			for b.Loop() {
				if v := gm[string(key)]; v != 42 {
					b.Fatal(v)
				}
			}
		})
	}
}
