package main

import (
	"net"
	"net/http"
	"net/http/pprof"
	"time"
)

// servePprof serves Go's profiler on ln (--pprof), a listener of its own so that
// it is never on the admin port by accident: go tool pprof
// http://ADDR/debug/pprof/profile?seconds=30, .../heap, .../trace?seconds=5.
// It has no authentication (warrend --pprof is for benchmarks and
// debugging on loopback).
func servePprof(ln net.Listener) (stop func()) {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	return func() { _ = hs.Close() }
}
