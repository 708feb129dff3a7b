package netio

// cgroupMemoryLimit and defaultMemoryHighWater are written in the fix.
func cgroupMemoryLimit(root, selfCgroup string) int64 { return 0 }

func defaultMemoryHighWater(cgroupRoot, selfCgroup string, hostRAM int64) int64 {
	return hostRAM * 4 / 10
}
