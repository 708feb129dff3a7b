package main

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// parseSize reads a byte count: a number, optionally followed by a unit,
// B, KB/MB/GB/TB (powers of 1000) or KiB/MiB/GiB/TiB (powers of 1024),
// case-insensitive ("2GiB", "500MB", "1048576").
func parseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := 0
	for i < len(t) && t[i] >= '0' && t[i] <= '9' {
		i++
	}
	if i == 0 {
		return 0, fmt.Errorf("%q: want a size in bytes, like 2GiB, 500MB or 1048576", s)
	}
	n, err := strconv.ParseInt(t[:i], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q: too large", s)
	}
	mult := int64(0)
	switch strings.ToLower(strings.TrimSpace(t[i:])) {
	case "", "b":
		mult = 1
	case "kb":
		mult = 1e3
	case "mb":
		mult = 1e6
	case "gb":
		mult = 1e9
	case "tb":
		mult = 1e12
	case "kib":
		mult = 1 << 10
	case "mib":
		mult = 1 << 20
	case "gib":
		mult = 1 << 30
	case "tib":
		mult = 1 << 40
	default:
		return 0, fmt.Errorf("%q: unknown unit (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)", s)
	}
	if n > math.MaxInt64/mult {
		return 0, fmt.Errorf("%q: too large", s)
	}
	return n * mult, nil
}

// byteSize is a size in the config file: a number of bytes or a string
// parseSize reads.
type byteSize int64

func (b *byteSize) UnmarshalJSON(data []byte) error {
	var n int64
	if json.Unmarshal(data, &n) == nil {
		*b = byteSize(n)
		return nil
	}
	var s string
	if err := json.Unmarshal(data, &s); err != nil {
		return fmt.Errorf("disk_free_limit: want a number of bytes or a size like \"2GiB\"")
	}
	v, err := parseSize(s)
	if err != nil {
		return fmt.Errorf("disk_free_limit %w", err)
	}
	*b = byteSize(v)
	return nil
}
