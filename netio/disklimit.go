package netio

import (
	"time"

	"golang.org/x/sys/unix"
)

// DefaultDiskFreeLimit is the free space on the data directory's
// filesystem below which publishers are blocked (the disk alarm): 2 GiB.
const DefaultDiskFreeLimit = 2 << 30

// diskFree is the free space an unprivileged process may still write on
// the filesystem that holds dir (statfs).
func diskFree(dir string) (int64, bool) {
	var st unix.Statfs_t
	if unix.Statfs(dir, &st) != nil {
		return 0, false
	}
	return int64(st.Bavail) * int64(st.Bsize), true
}

// checkDisk reads the free space (at most once per DiskCheckInterval, on
// the tick, never per message) and raises the disk alarm below
// DiskFreeLimit, clearing it at or above. While it is on, every publisher
// is blocked as under the memory alarm: transient messages to durable
// queues are written to the log too, and telling which queues a publish
// reaches would cost a route per frame. Consumers go on, so the backlog
// (and the log, as its segments are released) can drain. It reports
// whether the alarm changed. Tick goroutine.
func (s *Server) checkDisk() bool {
	if s.diskFree == nil {
		return false
	}
	now := time.Now()
	if now.Sub(s.lastDiskCheck) < s.cfg.DiskCheckInterval {
		return false
	}
	s.lastDiskCheck = now
	free, ok := s.diskFree()
	if !ok {
		return false // unreadable: keep what was last known
	}
	s.diskFreeBytes.Store(free)
	on := free < s.cfg.DiskFreeLimit
	if on == s.diskAlarm.Load() {
		return false
	}
	s.diskAlarm.Store(on)
	if on {
		s.log.Warn("free disk space below the limit: blocking publishers", "free_bytes", free, "disk_free_limit", s.cfg.DiskFreeLimit, "data", s.cfg.DataDir)
	} else {
		s.log.Info("free disk space above the limit: resuming publishers", "free_bytes", free, "disk_free_limit", s.cfg.DiskFreeLimit)
	}
	return true
}
