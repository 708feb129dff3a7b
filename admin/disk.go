package admin

import "syscall"

// SetDataDir names the broker's data directory, whose file system's free
// and total space the overview reports. Call it before serving.
func (a *API) SetDataDir(dir string) { a.dataDir = dir }

// diskSpace is the space available to an unprivileged user on dir's file
// system, and its size; zeros if it cannot be read.
func diskSpace(dir string) (free, total uint64) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, 0
	}
	return st.Bavail * uint64(st.Bsize), st.Blocks * uint64(st.Bsize)
}
