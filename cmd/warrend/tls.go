package main

import (
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/warren-mq/warren/internal/tlsfiles"
)

// tlsSettings checks the TLS settings and loads the files: nil without a
// TLS listener or HTTPS port.
func tlsSettings(fc *fileConfig) (*tlsfiles.Loader, error) {
	if fc.Listen == "off" && fc.TLSListen == "" {
		return nil, errors.New("listen off: the native protocol would have no listener; set tls_listen (--tls-listen) to serve it over TLS only")
	}
	if fc.HTTP == "off" && fc.HTTPS == "" {
		return nil, errors.New("http off: the console, API and /metrics would have no port; set https (--https) to serve them over TLS only")
	}
	if fc.TLSListen == "" && fc.HTTPS == "" {
		if fc.TLSCert != "" || fc.TLSKey != "" || fc.TLSCA != "" {
			return nil, errors.New("tls_cert, tls_key or tls_ca given without a TLS port: set tls_listen (--tls-listen) or https (--https)")
		}
		return nil, nil
	}
	if fc.TLSCert == "" || fc.TLSKey == "" {
		return nil, errors.New("tls_listen and https need a certificate and its key: set tls_cert and tls_key (--tls-cert, --tls-key; PEM files)")
	}
	return tlsfiles.Load(tlsfiles.Files{Cert: fc.TLSCert, Key: fc.TLSKey, CA: fc.TLSCA})
}

// reloadOnSIGHUP reloads the TLS files on each SIGHUP, for the handshakes
// that follow (established connections keep theirs). A reload that fails
// keeps the files loaded before and logs why. It returns the function that
// stops listening for the signal.
func reloadOnSIGHUP(l *tlsfiles.Loader, log *slog.Logger) (stop func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-hup:
				if err := l.Reload(); err != nil {
					log.Error("SIGHUP: TLS certificates not reloaded; the previous ones stay in use", "err", err)
					continue
				}
				leaf := l.Leaf()
				log.Info("TLS certificates reloaded", "subject", leaf.Subject.String(), "not_after", leaf.NotAfter)
			case <-done:
				return
			}
		}
	}()
	return func() {
		signal.Stop(hup)
		close(done)
	}
}

// tlsConfig is l's server config; nil without TLS.
func tlsConfig(l *tlsfiles.Loader) *tls.Config {
	if l == nil {
		return nil
	}
	return l.Config()
}

// addrString is a's address, or "off".
func addrString(a any) string {
	switch v := a.(type) {
	case net.Addr:
		if v != nil {
			return v.String()
		}
	case net.Listener:
		if v != nil {
			return v.Addr().String()
		}
	}
	return "off"
}
