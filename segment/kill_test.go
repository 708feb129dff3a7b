package segment

import (
	"bufio"
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

func payload(g, i uint64) []byte {
	return []byte(fmt.Sprintf("group %d entry %d %s", g, i, strings.Repeat("z", int(i%97))))
}

// TestMain lets the test binary act as the child of TestKillRecovery.
func TestMain(m *testing.M) {
	if dir := os.Getenv("SEGMENT_KILL_CHILD"); dir != "" {
		killChild(dir)
		return
	}
	os.Exit(m.Run())
}

// killChild appends forever (until killed), printing each acknowledged
// append.
func killChild(dir string) {
	l, err := Open(OSFS{}, dir, Options{})
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(1)
	}
	w := bufio.NewWriter(os.Stdout)
	r := rand.New(rand.NewPCG(uint64(os.Getpid()), 1))
	for {
		g := uint64(r.IntN(4))
		next := l.LastIndex(g) + 1
		n := 1 + r.IntN(8)
		var es []Entry
		for i := 0; i < n; i++ {
			es = append(es, Entry{Index: next + uint64(i), Term: 1, Data: payload(g, next+uint64(i))})
		}
		if err := l.Append(Batch{Group: g, Entries: es}); err != nil {
			fmt.Fprintln(w, "error:", err)
			w.Flush()
			os.Exit(1)
		}
		fmt.Fprintf(w, "ack %d %d\n", g, next+uint64(n-1))
		w.Flush()
	}
}

// TestKillRecovery: a child process appends with syncs on the real
// filesystem and is killed with SIGKILL at random moments; every append it
// acknowledged must be there, intact, after recovery.
func TestKillRecovery(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	dir := t.TempDir()
	r := rand.New(rand.NewPCG(1, 2))
	acked := map[uint64]uint64{}
	for round := 0; round < 5; round++ {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "SEGMENT_KILL_CHILD="+dir)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		killAfter := 20 + r.IntN(300)
		sc := bufio.NewScanner(out)
		n := 0
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) != 3 || f[0] != "ack" {
				t.Fatalf("child: %q %s", sc.Text(), stderr.String())
			}
			g, _ := strconv.ParseUint(f[1], 10, 64)
			i, _ := strconv.ParseUint(f[2], 10, 64)
			acked[g] = max(acked[g], i)
			if n++; n == killAfter {
				_ = cmd.Process.Signal(syscall.SIGKILL)
				break
			}
		}
		_ = cmd.Wait()
		l, err := Open(OSFS{}, dir, Options{})
		if err != nil {
			t.Fatalf("round %d: recovery: %v", round, err)
		}
		for g, last := range acked {
			if l.LastIndex(g) < last {
				t.Fatalf("round %d: group %d has %d entries, %d were acknowledged", round, g, l.LastIndex(g), last)
			}
			es, err := l.Entries(g, 1, l.LastIndex(g)+1)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range es {
				if !bytes.Equal(e.Data, payload(g, e.Index)) {
					t.Fatalf("round %d: group %d entry %d corrupted", round, g, e.Index)
				}
			}
			acked[g] = l.LastIndex(g) // unacknowledged-but-durable entries count from now on
		}
		l.Close()
	}
}
