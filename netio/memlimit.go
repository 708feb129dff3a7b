package netio

import (
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// noCgroupLimit: cgroup limits at or above this are "no limit" (v1 writes
// the largest page-aligned int64, 9223372036854771712, when none is set).
const noCgroupLimit = 1 << 62

// DefaultMemoryHighWater is the watermark used when none is configured:
// 40% of the memory this process may use, which is its cgroup's memory
// limit when it has one (a container's), else the host's RAM.
func DefaultMemoryHighWater() int64 {
	self, _ := os.ReadFile("/proc/self/cgroup")
	var si unix.Sysinfo_t
	ram := int64(0)
	if unix.Sysinfo(&si) == nil {
		ram = int64(si.Totalram) * int64(si.Unit)
	}
	return defaultMemoryHighWater("/sys/fs/cgroup", string(self), ram)
}

func defaultMemoryHighWater(cgroupRoot, selfCgroup string, hostRAM int64) int64 {
	avail := hostRAM
	if lim := cgroupMemoryLimit(cgroupRoot, selfCgroup); lim > 0 && (avail <= 0 || lim < avail) {
		avail = lim
	}
	if avail <= 0 {
		return 1 << 30
	}
	return avail * 4 / 10
}

// cgroupMemoryLimit returns the memory limit of the process's cgroup (the
// tightest along its path up to the hierarchy's root), or 0 when there is
// none. root is where the cgroup filesystems are mounted (/sys/fs/cgroup);
// selfCgroup is the content of /proc/self/cgroup. cgroup v1's memory
// controller (memory.limit_in_bytes under root/memory) is used when the
// process is in one, as on hybrid hosts; else v2's unified hierarchy
// (memory.max, root/cgroup.controllers present). A path that does not
// exist under root (a container that sees its host's paths but has its
// own cgroup mounted at root) falls back to the root's own limit.
func cgroupMemoryLimit(root, selfCgroup string) int64 {
	var v1, v2 string
	hasV1, hasV2 := false, false
	for _, line := range strings.Split(selfCgroup, "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		if f[0] == "0" && f[1] == "" {
			v2, hasV2 = f[2], true
			continue
		}
		for _, c := range strings.Split(f[1], ",") {
			if c == "memory" {
				v1, hasV1 = f[2], true
			}
		}
	}
	switch {
	case hasV1:
		return tightestLimit(filepath.Join(root, "memory"), v1, "memory.limit_in_bytes")
	case hasV2:
		if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err != nil {
			return 0
		}
		return tightestLimit(root, v2, "memory.max")
	}
	return 0
}

// tightestLimit reads file in the cgroup dir at rel under mount and in
// each of its ancestors up to mount, and returns the smallest limit.
func tightestLimit(mount, rel, file string) int64 {
	rel = path.Clean("/" + rel)
	if _, err := os.Stat(filepath.Join(mount, filepath.FromSlash(rel))); err != nil {
		rel = "/"
	}
	best := int64(0)
	for {
		if v := readLimit(filepath.Join(mount, filepath.FromSlash(rel), file)); v > 0 && (best == 0 || v < best) {
			best = v
		}
		if rel == "/" {
			return best
		}
		rel = path.Dir(rel)
	}
}

// readLimit parses a limit file: a byte count, or "max" (v2) / a huge
// value (v1) for none. Anything else reads as none.
func readLimit(p string) int64 {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || v <= 0 || v >= noCgroupLimit {
		return 0
	}
	return v
}
