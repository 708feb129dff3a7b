package client

import (
	"slices"
	"strings"
	"testing"
)

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
		if u.nodes[0].addr != c.addr || u.user != c.user || u.tls != c.tls {
			t.Errorf("%s: %+v, want addr %s user %s tls %v", c.url, u, c.addr, c.user, c.tls)
		}
	}
	if _, err := parseURL("amqps://h"); err == nil {
		t.Error("amqps:// accepted")
	}
}

// A URL may name several nodes, comma-separated: each gets the scheme's
// default port unless it names one, and they share the credentials and
// the virtual host.
func TestParseURLNodeList(t *testing.T) {
	for _, c := range []struct {
		url         string
		addrs       []string
		hosts       []string
		user, pass  string
		vhost       string
		tls         bool
		errContains string
	}{
		{url: "warren://u:p@h1:5680,h2:5690,h3:5700/staging", addrs: []string{"h1:5680", "h2:5690", "h3:5700"},
			hosts: []string{"h1", "h2", "h3"}, user: "u", pass: "p", vhost: "staging"},
		{url: "warrens://h1,h2:7000", addrs: []string{"h1:5681", "h2:7000"}, hosts: []string{"h1", "h2"},
			user: "guest", pass: "guest", tls: true},
		{url: "warren://[::1]:5680,127.0.0.1", addrs: []string{"[::1]:5680", "127.0.0.1:5680"},
			hosts: []string{"::1", "127.0.0.1"}, user: "guest", pass: "guest"},
		// A comma or an @ in a password is the userinfo's, not a list's.
		{url: "warren://u:a%2Cb%40c@h1,h2/%2F", addrs: []string{"h1:5680", "h2:5680"}, hosts: []string{"h1", "h2"},
			user: "u", pass: "a,b@c", vhost: "/"},
		{url: "warren://u:a,b@h1,h2", addrs: []string{"h1:5680", "h2:5680"}, hosts: []string{"h1", "h2"},
			user: "u", pass: "a,b"},

		{url: "warren://h1,,h3", errContains: "node 2 of 3 is empty"},
		{url: "warren://h1,", errContains: "node 2 of 2 is empty"},
		{url: "warren://,h2", errContains: "node 1 of 2 is empty"},
		{url: "warren://", errContains: "names no host"},
		{url: "warren://u:p@/vh", errContains: "names no host"},
		{url: "warren://h1:x,h2", errContains: `node 1 of 2 ("h1:x")`},
		{url: "warren://h1,h2:99999", errContains: `node 2 of 2 ("h2:99999")`},
		{url: "warren://h1,:5690", errContains: `node 2 of 2 (":5690"): names no host`},
		{url: "warren:h1", errContains: "want warren://"},
		{url: "h1:5680,h2:5690", errContains: "want warren://"},
		{url: "amqp://h1,h2", errContains: "scheme must be warren:// or warrens://"},
	} {
		u, err := parseURL(c.url)
		if c.errContains != "" {
			if err == nil {
				t.Errorf("%s: accepted as %+v", c.url, u)
			} else if !strings.Contains(err.Error(), c.errContains) {
				t.Errorf("%s: error %q does not say %q", c.url, err, c.errContains)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.url, err)
			continue
		}
		var addrs, hosts []string
		for _, n := range u.nodes {
			addrs, hosts = append(addrs, n.addr), append(hosts, n.host)
		}
		if !slices.Equal(addrs, c.addrs) || !slices.Equal(hosts, c.hosts) || u.user != c.user || u.pass != c.pass ||
			u.vhost != c.vhost || u.tls != c.tls {
			t.Errorf("%s: %+v", c.url, u)
		}
	}
}
