package wire

import (
	"errors"
	"testing"
)

// TestPropertiesHaveOneEncoding: a property is either absent or present with
// a non-empty value (PROTOCOL.md §10.1). The decoder refuses a present but
// empty value, which the materialized form cannot tell from absent (issue 11
// item 31, found by FuzzDecode), and the view encoder never writes one.
func TestPropertiesHaveOneEncoding(t *testing.T) {
	for id := PropID(1); id <= maxKnownProp; id++ {
		if id == PropExpiration || id == PropTimestamp {
			continue // fixed size: an empty value is already the wrong size
		}
		block := []byte{uint8(id), 0, 0}
		if err := ValidateProperties(block); !errors.Is(err, &Error{Code: FrameError}) {
			t.Errorf("property %d present and empty: got %v, want frame_error", id, err)
		}
	}
	if err := ValidateProperties([]byte{uint8(PropDeaths), 1, 0, 0}); !errors.Is(err, &Error{Code: FrameError}) {
		t.Errorf("deaths with no entries: got %v, want frame_error", err)
	}

	var p Properties
	for id := PropID(1); id <= maxKnownProp; id++ {
		p.Set(id) // every field left empty; the two fixed-size ones are 0
	}
	p.Deaths = AppendDeaths(nil, nil) // count 0
	block := AppendProperties(nil, &p)[2:]
	var back Properties
	if err := ParseProperties(block, &back); err != nil {
		t.Fatalf("AppendProperties wrote a block the decoder refuses: %v (% x)", err, block)
	}
	if want := uint16(1<<PropExpiration | 1<<PropTimestamp); back.Present != want {
		t.Fatalf("present after round trip %016b, want only expiration and timestamp %016b", back.Present, want)
	}
}
