package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// A node that is not serving answers the admin API with 503 and a line
// saying why: warrenctl shows that line and says to ask another node,
// where it showed only the status.
func TestNotServingSaysWhy(t *testing.T) {
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "recovering: the broker is not serving yet", http.StatusServiceUnavailable)
	}))
	defer hs.Close()
	c := &cli{api: hs.URL, apiUser: "guest", apiPass: "guest", ctx: context.Background()}
	err := c.call("GET", "/api/cluster", nil, nil)
	if err == nil || !strings.Contains(err.Error(), "recovering: the broker is not serving yet") || !strings.Contains(err.Error(), "ask another node") {
		t.Fatalf("call against a node not serving: %v", err)
	}
}
