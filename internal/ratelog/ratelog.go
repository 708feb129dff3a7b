// Package ratelog rate-limits log lines.
package ratelog

import (
	"sync"
	"time"
)

// Limiter rate-limits one kind of log line: at most Burst lines (1 if
// zero) per interval are let through; the others are counted and the count
// goes out with the next line let through, so a flood (failed logins,
// dropped dead letters) can neither fill the disk nor hide that it
// happened. Time is an input, so tests drive it with a fake clock.
type Limiter struct {
	Every time.Duration
	Burst int

	mu         sync.Mutex
	windowEnd  time.Time
	n          int // lines let through in the current window
	suppressed int
}

// Allow reports whether a line may be logged at now and, if so, how many
// were suppressed since the last one.
func (l *Limiter) Allow(now time.Time) (ok bool, suppressed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !now.Before(l.windowEnd) {
		l.windowEnd, l.n = now.Add(l.Every), 0
	}
	if l.n >= max(l.Burst, 1) {
		l.suppressed++
		return false, 0
	}
	l.n++
	suppressed, l.suppressed = l.suppressed, 0
	return true, suppressed
}
