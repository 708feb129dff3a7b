// Package tlsfiles loads a server's TLS certificate, key and client CA
// from PEM files and reloads them on demand (warrend does on SIGHUP).
//
// The tls.Config that Config returns picks the files' current contents
// for every new handshake (GetConfigForClient), so a reload applies to the
// next connection and never touches the ones already established. A
// reload that fails (a missing file, a key that does not match its
// certificate, a CA file with no certificate) keeps what was loaded
// before and says why.
//
// The protocol settings are Go's defaults with TLS 1.2 as the minimum.
// With a CA file, client certificates are optional and, when given, must
// chain to one of its certificates (tls.VerifyClientCertIfGiven): a client
// without one authenticates with a password, one with a certificate from
// another CA fails the handshake.
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
)

// Files names the PEM files. CA is optional.
type Files struct {
	Cert, Key, CA string
}

// Loader holds the loaded files.
type Loader struct {
	files   Files
	current atomic.Pointer[tls.Config] // the per-handshake config, replaced whole by Reload
}

// Load reads the files once.
func Load(f Files) (*Loader, error) {
	if f.Cert == "" || f.Key == "" {
		return nil, errors.New("tls: both a certificate (tls_cert) and its key (tls_key) are needed")
	}
	l := &Loader{files: f}
	if err := l.Reload(); err != nil {
		return nil, err
	}
	return l, nil
}

// Reload reads the files again. On an error the previous ones stay in use.
func (l *Loader) Reload() error {
	cert, err := tls.LoadX509KeyPair(l.files.Cert, l.files.Key)
	if err != nil {
		return fmt.Errorf("tls: loading the certificate %s and key %s: %w", l.files.Cert, l.files.Key, err)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
	if l.files.CA != "" {
		b, err := os.ReadFile(l.files.CA)
		if err != nil {
			return fmt.Errorf("tls: client CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			return fmt.Errorf("tls: client CA %s holds no PEM certificate", l.files.CA)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.VerifyClientCertIfGiven
	}
	l.current.Store(cfg)
	return nil
}

// Config is the server tls.Config to listen with: each handshake uses the
// files as last loaded.
func (l *Loader) Config() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return l.current.Load(), nil
		},
	}
}

// Leaf is the certificate in use (its first, leaf, certificate parsed),
// for logs and tests.
func (l *Loader) Leaf() *x509.Certificate {
	c := l.current.Load().Certificates[0]
	if c.Leaf != nil {
		return c.Leaf
	}
	x, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		return nil
	}
	return x
}
