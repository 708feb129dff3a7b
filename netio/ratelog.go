package netio

import (
	"sync"
	"time"
)

// logLimiter rate-limits one kind of log line: at most one line per
// interval is let through; the others are counted and the count goes out
// with the next line let through, so a flood (failed logins, dropped dead
// letters) cannot fill the disk nor hide that it happened. Time is an
// input, so tests drive it with a fake clock.
type logLimiter struct {
	every time.Duration

	mu         sync.Mutex
	next       time.Time
	suppressed int
}

// allow reports whether a line may be logged at now and, if so, how many
// were suppressed since the last one.
func (l *logLimiter) allow(now time.Time) (ok bool, suppressed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Before(l.next) {
		l.suppressed++
		return false, 0
	}
	l.next = now.Add(l.every)
	suppressed, l.suppressed = l.suppressed, 0
	return true, suppressed
}
