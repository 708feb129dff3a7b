// Package syncbuf is a bytes.Buffer that goroutines may write to while a
// test reads it: the log destination of tests that assert on what a
// broker logged.
package syncbuf

import (
	"bytes"
	"strings"
	"sync"
)

// Buffer is safe for concurrent writers and readers.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *Buffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// String is everything written so far.
func (w *Buffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// Count is how many times s was written (strings.Count of String).
func (w *Buffer) Count(s string) int { return strings.Count(w.String(), s) }
