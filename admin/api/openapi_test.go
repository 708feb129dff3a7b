package api

import (
	"encoding/json"
	"math"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/warren-mq/warren/wire"
)

// openAPIProp is one property of a schema in spec/admin-api.yaml, as far
// as the queue-argument check reads it.
type openAPIProp struct {
	Type      string   `yaml:"type"`
	Minimum   *float64 `yaml:"minimum"`
	Maximum   *float64 `yaml:"maximum"`
	MaxLength *int     `yaml:"maxLength"`
	Enum      []any    `yaml:"enum"`
	Default   any      `yaml:"default"`
}

// checkOpenAPIArgs compares the QueueSettings schema of an OpenAPI
// document (spec/admin-api.yaml) with the queue-argument descriptors:
// the same JSON names (besides durable and auto_delete), and for each the
// type, minimum, maximum, maxLength, enum and default the descriptor
// implies. It returns what differs, one line each.
func checkOpenAPIArgs(doc []byte) []string {
	var spec struct {
		Components struct {
			Schemas map[string]struct {
				Properties map[string]openAPIProp `yaml:"properties"`
			} `yaml:"schemas"`
		} `yaml:"components"`
	}
	if err := yaml.Unmarshal(doc, &spec); err != nil {
		return []string{"not YAML: " + err.Error()}
	}
	props := spec.Components.Schemas["QueueSettings"].Properties
	if props == nil {
		return []string{"no components.schemas.QueueSettings.properties"}
	}
	var problems []string
	bad := func(name, what string, got, want any) {
		problems = append(problems, name+": "+what+" "+show(got)+", want "+show(want))
	}
	for _, d := range wire.QueueArgDescs() {
		p, ok := props[d.JSON]
		if !ok {
			problems = append(problems, d.JSON+": no property (queue argument "+d.Key+")")
			continue
		}
		var typ string
		var lo, hi *float64
		var maxLen *int
		var enum []any
		switch d.Kind {
		case wire.ArgInt, wire.ArgMillis:
			typ = "integer"
			if len(d.Enum) > 0 {
				for _, e := range d.Enum {
					n, _ := strconv.Atoi(e)
					enum = append(enum, n)
				}
				break
			}
			lo = ptr(float64(d.Min))
			if d.Max != math.MaxInt64 && d.Max != wire.MaxArgMillis {
				hi = ptr(float64(d.Max))
			}
		case wire.ArgNumber:
			typ, lo, hi = "number", ptr(float64(d.Min)), ptr(float64(d.Max))
		case wire.ArgBool:
			typ = "boolean"
		case wire.ArgString:
			typ, maxLen = "string", ptr(wire.MaxNameLen)
		case wire.ArgEnum:
			typ = "string"
			for _, e := range d.Enum {
				enum = append(enum, e)
			}
		}
		var def any
		if d.Default != "" {
			def = d.Default
			if n, err := strconv.Atoi(d.Default); err == nil {
				def = n
			}
		}
		if p.Type != typ {
			bad(d.JSON, "type", p.Type, typ)
		}
		if !reflect.DeepEqual(p.Minimum, lo) {
			bad(d.JSON, "minimum", p.Minimum, lo)
		}
		if !reflect.DeepEqual(p.Maximum, hi) {
			bad(d.JSON, "maximum", p.Maximum, hi)
		}
		if !reflect.DeepEqual(p.MaxLength, maxLen) {
			bad(d.JSON, "maxLength", p.MaxLength, maxLen)
		}
		if !reflect.DeepEqual(p.Enum, enum) {
			bad(d.JSON, "enum", p.Enum, enum)
		}
		if !reflect.DeepEqual(p.Default, def) {
			bad(d.JSON, "default", p.Default, def)
		}
	}
	for name := range props {
		if name == "durable" || name == "auto_delete" {
			continue
		}
		if !slices.ContainsFunc(wire.QueueArgDescs(), func(d wire.QueueArgDesc) bool { return d.JSON == name }) {
			problems = append(problems, name+": a property that is no queue argument")
		}
	}
	slices.Sort(problems)
	return problems
}

func ptr[T any](v T) *T { return &v }

func show(v any) string {
	rv := reflect.ValueOf(v)
	if !rv.IsValid() || (rv.Kind() == reflect.Pointer || rv.Kind() == reflect.Slice) && rv.IsNil() {
		return "(none)"
	}
	if rv.Kind() == reflect.Pointer {
		v = rv.Elem().Interface()
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// TestAdminAPISpecQueueArgs: spec/admin-api.yaml's QueueSettings lists
// exactly the queue arguments of the descriptor table, with the same
// types, ranges, enums and defaults.
func TestAdminAPISpecQueueArgs(t *testing.T) {
	b, err := os.ReadFile("../../spec/admin-api.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range checkOpenAPIArgs(b) {
		t.Errorf("spec/admin-api.yaml QueueSettings: %s", p)
	}
}

// TestCheckOpenAPIArgsFails: the checker finds each kind of drift in a
// doctored copy of a good schema.
func TestCheckOpenAPIArgsFails(t *testing.T) {
	var good strings.Builder
	good.WriteString("components:\n  schemas:\n    QueueSettings:\n      type: object\n      properties:\n        durable: {type: boolean}\n        auto_delete: {type: boolean}\n")
	for _, d := range wire.QueueArgDescs() {
		var f []string
		switch d.Kind {
		case wire.ArgInt, wire.ArgMillis:
			f = append(f, "type: integer")
			if len(d.Enum) > 0 {
				f = append(f, "enum: ["+strings.Join(d.Enum, ", ")+"]")
				break
			}
			f = append(f, "minimum: "+strconv.FormatInt(d.Min, 10))
			if d.Max != math.MaxInt64 && d.Max != wire.MaxArgMillis {
				f = append(f, "maximum: "+strconv.FormatInt(d.Max, 10))
			}
		case wire.ArgNumber:
			f = append(f, "type: number", "minimum: "+strconv.FormatInt(d.Min, 10), "maximum: "+strconv.FormatInt(d.Max, 10))
		case wire.ArgBool:
			f = append(f, "type: boolean")
		case wire.ArgString:
			f = append(f, "type: string", "maxLength: 255")
		case wire.ArgEnum:
			f = append(f, "type: string", "enum: ["+strings.Join(d.Enum, ", ")+"]")
		}
		if d.Default != "" {
			f = append(f, "default: "+d.Default)
		}
		good.WriteString("        " + d.JSON + ": {" + strings.Join(f, ", ") + "}\n")
	}
	if p := checkOpenAPIArgs([]byte(good.String())); len(p) != 0 {
		t.Fatalf("a schema written from the descriptors: %q", p)
	}
	for _, c := range []struct{ old, new, want string }{
		{"max_priority: {type: integer, minimum: 1, maximum: 255}", "max_priority: {type: integer, minimum: 1, maximum: 256}", "max_priority: maximum 256, want 255"},
		{"delivery_limit: {type: integer, minimum: 1, maximum: 4294967295}", "delivery_limit: {type: integer, minimum: 1}", "delivery_limit: maximum (none), want 4294967295"},
		{"enum: [drop-head, reject-publish, reject-publish-dlx, dead-letter]", "enum: [drop-head, reject-publish, reject-publish-dlx]", "overflow: enum"},
		{"enum: [1, 3, 5]", "enum: [1, 3]", "replicas: enum"},
		{"retry_multiplier: {type: number", "retry_multiplier: {type: integer", "retry_multiplier: type \"integer\", want \"number\""},
		{"dedup_window_ms:", "dedup_window:", "dedup_window_ms: no property"},
		{"dedup_window_ms:", "dedup_window:", "dedup_window: a property that is no queue argument"},
		{", default: drop-head", "", "overflow: default (none), want \"drop-head\""},
		{"dead_letter_exchange: {type: string, maxLength: 255}", "dead_letter_exchange: {type: string}", "dead_letter_exchange: maxLength (none), want 255"},
	} {
		doc := strings.Replace(good.String(), c.old, c.new, 1)
		if doc == good.String() {
			t.Fatalf("doctoring %q changed nothing", c.old)
		}
		p := checkOpenAPIArgs([]byte(doc))
		if !slices.ContainsFunc(p, func(s string) bool { return strings.Contains(s, c.want) }) {
			t.Errorf("%q → %q: problems %q, want one containing %q", c.old, c.new, p, c.want)
		}
	}
}
