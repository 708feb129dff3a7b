package loadtest

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"
)

// userHZ is the unit of the CPU times in /proc/PID/stat: Linux reports
// them in USER_HZ ticks, which its user-space ABI fixes at 100 a second.
const userHZ = 100

// cpuTimes is a process's CPU time (user + system) so far.
type cpuTimes struct {
	broker, client time.Duration
	brokerOK       bool
}

// cpuMeter samples the CPU time of the broker process (by pid, from
// /proc; none if pid is 0) and of this process (the whole load generator:
// producers, consumers and the tracker).
type cpuMeter struct{ pid int }

func (m cpuMeter) sample() cpuTimes {
	var t cpuTimes
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		t.client = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	if m.pid > 0 {
		if b, err := os.ReadFile("/proc/" + strconv.Itoa(m.pid) + "/stat"); err == nil {
			t.broker, t.brokerOK = parseProcStatCPU(b)
		}
	}
	return t
}

// parseProcStatCPU reads utime + stime from a /proc/PID/stat line. The
// second field, the command name in parentheses, may itself hold spaces
// and parentheses, so the fields are counted from the last ')'.
func parseProcStatCPU(b []byte) (time.Duration, bool) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	f := bytes.Fields(b[i+1:])
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, false
	}
	ut, err1 := strconv.ParseUint(string(f[11]), 10, 64)
	st, err2 := strconv.ParseUint(string(f[12]), 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(ut+st) * time.Second / userHZ, true
}

// perMessage is CPU microseconds per consumed message between two samples.
func perMessage(from, to time.Duration, consumed int64) float64 {
	if consumed <= 0 || to < from {
		return 0
	}
	return float64(to-from) / float64(time.Microsecond) / float64(consumed)
}

// cpuString prints a CPU-per-message figure, "–" when unknown.
func cpuString(v float64) string {
	if v <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", v)
}
