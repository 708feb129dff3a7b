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

// killOpts are small files, so that the child rotates its WAL, moves it
// into segments, and compacts and deletes segment files all the time.
var killOpts = Options{WALSize: 64 << 10, SegmentSize: 32 << 10}

// liveBelow is the child's rule for live entries below a compaction point:
// every third index stays, as if those messages were not acked yet.
func liveBelow(upTo uint64) []uint64 {
	var out []uint64
	for k := uint64(3); k <= upTo; k += 3 {
		out = append(out, k)
	}
	return out
}

// killChild appends forever (until killed), printing each acknowledged
// append, and compacts each group now and then, keeping liveBelow.
func killChild(dir string) {
	l, err := Open(OSFS{}, dir, killOpts)
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
		if last := next + uint64(n-1); r.IntN(20) == 0 && last > 40 {
			if err := l.Compact(g, last-30, liveBelow(last-30)); err != nil {
				fmt.Fprintln(w, "error:", err)
				w.Flush()
				os.Exit(1)
			}
		}
	}
}

// TestKillRecovery: a child process appends with syncs on the real
// filesystem, compacts, and moves and deletes files in the background, and
// is killed with SIGKILL at random moments; every append it acknowledged
// must be there, intact, after recovery, and so must every live entry
// below the compaction points.
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
		killAfter := 200 + r.IntN(2000)
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
		l, err := Open(OSFS{}, dir, killOpts)
		if err != nil {
			t.Fatalf("round %d: recovery: %v", round, err)
		}
		for g, last := range acked {
			if l.LastIndex(g) < last {
				t.Fatalf("round %d: group %d has %d entries, %d were acknowledged", round, g, l.LastIndex(g), last)
			}
			first := l.FirstIndex(g)
			es, err := l.Entries(g, first, l.LastIndex(g)+1)
			if err != nil {
				t.Fatal(err)
			}
			live := liveBelow(first - 1)
			if err := l.Compact(g, first-1, live); err != nil {
				t.Fatalf("round %d: group %d: %v", round, g, err)
			}
			for _, k := range live {
				v, release, err := l.EntriesView(g, k, k+1)
				if err != nil {
					t.Fatalf("round %d: group %d live entry %d: %v", round, g, k, err)
				}
				es = append(es, Entry{Index: k, Data: bytes.Clone(v[0].Data)})
				release()
			}
			for _, e := range es {
				if !bytes.Equal(e.Data, payload(g, e.Index)) {
					t.Fatalf("round %d: group %d entry %d corrupted", round, g, e.Index)
				}
			}
			acked[g] = l.LastIndex(g) // unacknowledged-but-durable entries count from now on
		}
		st := l.Stats()
		files, _ := os.ReadDir(dir)
		t.Logf("round %d: %d files, %+v", round, len(files), st)
		l.Close()
	}
}
