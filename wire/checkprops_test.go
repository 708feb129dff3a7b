package wire

import (
	"strings"
	"testing"
)

// TestCheckProps: CheckProps refuses what AppendProps cannot encode (it
// panics: a string over 65,535 bytes, a header key over 255 bytes or of
// no known kind, over 255 death records, a death's routing key over 255
// bytes, a block over MaxPropertiesLen) and passes what it can, up to the
// bound exactly.
func TestCheckProps(t *testing.T) {
	long := func(n int) string { return strings.Repeat("s", n) }
	for name, p := range map[string]*Props{
		"content_type of 65,536 bytes": {ContentType: long(65536)},
		"a header key of 256 bytes":    {Headers: Table{{Key: long(256), Value: Int(1)}}},
		"a header of kind 99":          {Headers: Table{{Key: "k", Value: Value{Kind: 99}}}},
		"256 death records":            {Deaths: make([]Death, 256)},
		"a death's routing key":        {Deaths: []Death{{Queue: "q", Reason: ReasonRejected, RoutingKeys: []string{long(256)}}}},
		"a death's queue":              {Deaths: []Death{{Queue: long(256), Reason: ReasonRejected}}},
		"a block of 65,536 bytes":      {ContentType: long(65535 - 3 - 3 - 100), AppID: long(101)},
	} {
		if err := CheckProps(p); err == nil {
			t.Errorf("%s: passed", name)
		}
	}
	for name, p := range map[string]*Props{
		"nil":                      nil,
		"a block of 65,535 bytes":  {ContentType: long(65535 - 3 - 3 - 100), AppID: long(100)},
		"255 deaths, 255-byte key": {Deaths: append(make([]Death, 254), Death{Queue: long(255), Reason: ReasonExpired, RoutingKeys: []string{long(255)}})},
		"headers nested 8 deep":    {Headers: Table{{Key: long(255), Value: TableValue(Table{{Key: "k", Value: ArrayValue([]Value{Int(1)})}})}}},
	} {
		if err := CheckProps(p); err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if b := AppendProps(nil, p); len(b)-2 > MaxPropertiesLen {
			t.Errorf("%s: %d bytes", name, len(b)-2)
		}
	}
}
