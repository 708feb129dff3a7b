package wire

import (
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// specValue is how spec/PROTOCOL.md §7.2's table writes a queue argument's
// value column: its kind and bounds (bounds that are the kind's own, the
// int64 ceiling or MaxArgMillis, are left out: the text above the table
// states them).
func specValue(d *QueueArgDesc) string {
	rng := func(unit string, ceiling int64) string {
		if d.Max == ceiling {
			return unit + " ≥ " + strconv.FormatInt(d.Min, 10)
		}
		return unit + " " + strconv.FormatInt(d.Min, 10) + ".." + strconv.FormatInt(d.Max, 10)
	}
	switch d.Kind {
	case ArgInt:
		if len(d.Enum) > 0 {
			return "int " + orList(d.Enum)
		}
		return rng("int", math.MaxInt64)
	case ArgMillis:
		return rng("int ms", MaxArgMillis)
	case ArgNumber:
		return rng("number", math.MaxInt64)
	case ArgBool:
		return "bool"
	case ArgString:
		return "string ≤ " + strconv.Itoa(MaxNameLen) + " bytes"
	case ArgEnum:
		q := make([]string, len(d.Enum))
		for i, e := range d.Enum {
			q[i] = "`" + e + "`"
		}
		return "string: " + orList(q)
	}
	return "?"
}

// checkProtocolArgs compares the queue arguments table of spec/PROTOCOL.md
// §7.2 (md, the whole file) with the descriptors: the same keys, each with
// the value column specValue writes, and a meaning that names its default
// ("default `X`"). It returns what differs, one line each.
func checkProtocolArgs(md string) []string {
	var problems []string
	_, sec, ok := strings.Cut(md, "\n### 7.2 Queues\n")
	if !ok {
		return []string{"no section \"### 7.2 Queues\""}
	}
	sec, _, _ = strings.Cut(sec, "\n### ")
	_, tbl, ok := strings.Cut(sec, "\n| key | value | meaning |\n|---|---|---|\n")
	if !ok {
		return []string{"§7.2 has no table headed | key | value | meaning |"}
	}
	rows := map[string][2]string{}
	var order []string
	for _, line := range strings.Split(tbl, "\n") {
		if !strings.HasPrefix(line, "|") {
			break
		}
		cells := splitRow(line)
		if len(cells) != 3 {
			problems = append(problems, "row with "+strconv.Itoa(len(cells))+" cells, want 3: "+line)
			continue
		}
		key := strings.Trim(cells[0], "`")
		if strings.ContainsAny(key, "`, ") {
			problems = append(problems, "row "+cells[0]+": one key per row")
			continue
		}
		if _, dup := rows[key]; dup {
			problems = append(problems, "key "+key+": two rows")
		}
		rows[key] = [2]string{cells[1], cells[2]}
		order = append(order, key)
	}
	var want []string
	for i := range queueArgDescs {
		d := &queueArgDescs[i]
		want = append(want, d.Key)
		row, ok := rows[d.Key]
		if !ok {
			problems = append(problems, "key "+d.Key+": no row")
			continue
		}
		if v := specValue(d); row[0] != v {
			problems = append(problems, "key "+d.Key+": value "+strconv.Quote(row[0])+", want "+strconv.Quote(v))
		}
		if d.Default != "" && !strings.Contains(strings.ToLower(row[1]), "default `"+d.Default+"`") {
			problems = append(problems, "key "+d.Key+": the meaning does not say \"default `"+d.Default+"`\"")
		}
	}
	for _, k := range order {
		if _, ok := LookupQueueArg(k); !ok {
			problems = append(problems, "key "+k+": in the spec but not a queue argument")
		}
	}
	if len(problems) == 0 && !slices.Equal(order, want) {
		problems = append(problems, "rows in the order "+strings.Join(order, " ")+", want "+strings.Join(want, " "))
	}
	return problems
}

// splitRow splits a markdown table row into its trimmed cells (an escaped
// \| stays in its cell).
func splitRow(line string) []string {
	line = strings.TrimSpace(line)
	line = strings.TrimPrefix(strings.TrimSuffix(line, "|"), "|")
	var cells []string
	var cur strings.Builder
	for i := 0; i < len(line); i++ {
		switch {
		case line[i] == '\\' && i+1 < len(line) && line[i+1] == '|':
			cur.WriteByte('|')
			i++
		case line[i] == '|':
			cells = append(cells, strings.TrimSpace(cur.String()))
			cur.Reset()
		default:
			cur.WriteByte(line[i])
		}
	}
	return append(cells, strings.TrimSpace(cur.String()))
}

// TestProtocolQueueArgs: spec/PROTOCOL.md §7.2 lists exactly the queue
// arguments of the descriptor table, with the same kinds, ranges, enums
// and defaults, so the spec and the broker cannot drift apart.
func TestProtocolQueueArgs(t *testing.T) {
	b, err := os.ReadFile("../spec/PROTOCOL.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range checkProtocolArgs(string(b)) {
		t.Errorf("spec/PROTOCOL.md §7.2: %s", p)
	}
}

// TestCheckProtocolArgsFails: the checker finds each kind of drift in a
// doctored copy of a good table.
func TestCheckProtocolArgsFails(t *testing.T) {
	var good strings.Builder
	good.WriteString("# x\n\n### 7.2 Queues\n\ntext\n\n| key | value | meaning |\n|---|---|---|\n")
	for i := range queueArgDescs {
		d := &queueArgDescs[i]
		m := d.Doc
		if d.Default != "" {
			m += ". Default `" + d.Default + "`"
		}
		good.WriteString("| `" + d.Key + "` | " + specValue(d) + " | " + m + " |\n")
	}
	good.WriteString("\nafter\n\n### 7.3 Bindings\n")
	if p := checkProtocolArgs(good.String()); len(p) != 0 {
		t.Fatalf("a table written from the descriptors: %q", p)
	}
	for _, c := range []struct{ old, new, want string }{
		{"| int 1..255 |", "| int 1..256 |", `key max-priority: value "int 1..256", want "int 1..255"`},
		{"| number 1..1000 |", "| number ≥ 1 |", `key retry-multiplier: value "number ≥ 1", want "number 1..1000"`},
		{"`reject-publish-dlx` or `dead-letter`", "`reject-publish-dlx`", "key overflow: value"},
		{"| int 1, 3 or 5 |", "| int 1..5 |", "key replicas: value"},
		{"| `dedup-window-ms` |", "| `dedup-window` |", "key dedup-window-ms: no row"},
		{"| `expires` |", "| `x-expires` |", "key x-expires: in the spec but not a queue argument"},
		{"Default `drop-head`", "", "key overflow: the meaning does not say \"default `drop-head`\""},
		{"| `max-length` |", "| `max-length`, `max-length-bytes` |", "one key per row"},
	} {
		doc := strings.Replace(good.String(), c.old, c.new, 1)
		if doc == good.String() {
			t.Fatalf("doctoring %q changed nothing", c.old)
		}
		p := checkProtocolArgs(doc)
		if !slices.ContainsFunc(p, func(s string) bool { return strings.Contains(s, c.want) }) {
			t.Errorf("%q → %q: problems %q, want one containing %q", c.old, c.new, p, c.want)
		}
	}
}
