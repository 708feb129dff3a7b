package queue

import (
	"bytes"
	"math"

	"github.com/warren-mq/warren/wire"
)

// Exchange is a declared exchange.
type Exchange struct {
	Name      string
	Kind      wire.ExchangeKind
	Alternate string // exchange for messages nothing else takes; "" for none
	Internal  bool
	Args      wire.Table // consistent-hash: "hash-header" (string) hashes that header instead of the key
}

// Binding routes from exchange Source to a queue, or to an exchange when
// ToExchange. Key is a binding key (direct), a pattern (topic) or a weight
// (consistent-hash, an integer ≥ 1; empty means 1); Args carry header
// matches (headers exchange, with "x-match" = "all" or "any").
type Binding struct {
	Source      string
	Destination string
	ToExchange  bool
	Key         string
	Args        wire.Table
}

// headerMatch is a headers binding's condition.
type headerMatch struct {
	any   bool
	match wire.Table // required header values (x- keys removed)
}

// fmix64 is MurmurHash3's 64-bit finaliser: a bijection whose every output
// bit depends on every input bit, so u for different destinations of the
// same key look independent.
func fmix64(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}

// maxExchangeHops bounds exchange-to-exchange chains (and so cycles).
const maxExchangeHops = 16

// headerBytes returns a header's value as bytes for hashing: strings and
// bytes as they are, numbers in decimal-free fixed form (their raw bits).
func headerBytes(headers []byte, name string) []byte {
	it := wire.NewTableIter(headers)
	for k, v, ok := it.Next(); ok; k, v, ok = it.Next() {
		if string(k) == name {
			if v.Kind == wire.KindString || v.Kind == wire.KindBytes {
				return v.Bytes
			}
			return nil
		}
	}
	return nil
}

func (hb *headerMatch) matches(headers []byte) bool {
	if len(hb.match) == 0 {
		return !hb.any // all-of-nothing matches; any-of-nothing does not
	}
	matched := 0
	for i := range hb.match {
		want := &hb.match[i]
		it := wire.NewTableIter(headers)
		found := false
		for k, v, ok := it.Next(); ok; k, v, ok = it.Next() {
			if string(k) == want.Key {
				found = valueEqual(&want.Value, &v)
				break
			}
		}
		if found {
			matched++
			if hb.any {
				return true
			}
		} else if !hb.any {
			return false
		}
	}
	return matched == len(hb.match)
}

// valueEqual compares a binding's value with a header's. A binding value of
// kind null matches any value of the key (presence only).
func valueEqual(want, got *wire.Value) bool {
	if want.Kind == wire.KindNull {
		return true
	}
	if want.Kind != got.Kind {
		return false
	}
	switch want.Kind {
	case wire.KindBool, wire.KindInt, wire.KindTimestamp:
		return want.Int == got.Int
	case wire.KindFloat:
		return want.Float == got.Float || (math.IsNaN(want.Float) && math.IsNaN(got.Float))
	case wire.KindString, wire.KindBytes:
		return bytes.Equal(want.Bytes, got.Bytes)
	}
	return false // containers are not matched
}
