package client

import "testing"

// warrens:// is the native protocol over TLS, on port 5681 by default.
func TestParseURLSchemes(t *testing.T) {
	for _, c := range []struct {
		url, addr, user string
		tls             bool
	}{
		{"warren://h", "h:5680", "guest", false},
		{"warrens://h", "h:5681", "guest", true},
		{"warrens://app:pw@h:7000", "h:7000", "app", true},
	} {
		u, err := parseURL(c.url)
		if err != nil {
			t.Fatalf("%s: %v", c.url, err)
		}
		if u.addr != c.addr || u.user != c.user || u.tls != c.tls {
			t.Errorf("%s: %+v, want addr %s user %s tls %v", c.url, u, c.addr, c.user, c.tls)
		}
	}
	if _, err := parseURL("amqps://h"); err == nil {
		t.Error("amqps:// accepted")
	}
}
