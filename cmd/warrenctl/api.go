package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/warren-mq/warren/admin/api"
)

// ---- admin API ----

// call sends a request to the admin API and decodes the reply into out.
func (c *cli) call(method, path string, body any, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(c.ctx, method, strings.TrimRight(c.api, "/")+path, rd)
	if err != nil {
		return err
	}
	req.SetBasicAuth(c.apiUser, c.apiPass)
	req.Header.Set("Content-Type", "application/json")
	hc := &http.Client{Timeout: 15 * time.Minute}
	if c.tlsCfg != nil {
		hc.Transport = &http.Transport{TLSClientConfig: c.tlsCfg, Proxy: http.ProxyFromEnvironment}
	}
	resp, err := hc.Do(req)
	if err != nil {
		var op *net.OpError
		if c.apiDerived && errors.As(err, &op) && op.Op == "dial" {
			// Nothing there, at an address warrenctl guessed: say so, and
			// how to name the right one (warrend's --http address).
			return fmt.Errorf("admin API at %s (the --url port + 10000, as neither --api nor WARREN_API names one; give warrend's --http address: --api http://HOST:PORT): %w", c.api, err)
		}
		return fmt.Errorf("admin API at %s: %w", c.api, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 300 {
		var eb api.ErrorBody
		if json.Unmarshal(b, &eb) == nil && eb.Error.Name != "" {
			h := hint(method, path, eb.Error.Name)
			if eb.Error.Name == "auth_failed" && c.apiDefaultUser {
				h = " (the admin API needs a password user, and neither --url nor --api names one, so it tried guest: a client certificate logs in only on the native protocol; give one as --api https://USER:PASS@HOST:15681)"
			}
			return fmt.Errorf("%s: %s%s", eb.Error.Name, eb.Error.Message, h)
		}
		msg := fmt.Sprintf("admin API: %s %s: HTTP %s", method, path, resp.Status)
		if text := strings.TrimSpace(string(b)); text != "" && len(text) < 500 {
			msg += ": " + text // e.g. a node not serving yet says why
		}
		if resp.StatusCode == http.StatusServiceUnavailable {
			msg += " (this node is not serving: ask another node with --api, or wait for it)"
		}
		return errors.New(msg)
	}
	if out != nil && len(b) > 0 {
		if raw, ok := out.(*json.RawMessage); ok {
			*raw = append((*raw)[:0], b...)
			return nil
		}
		return json.Unmarshal(b, out)
	}
	return nil
}

// hint says what to do about an admin API error, from the request that
// got it.
func hint(method, path, code string) string {
	path, _, _ = strings.Cut(path, "?") // ?vhost=
	kind, name, _ := strings.Cut(strings.TrimPrefix(path, "/api/"), "/")
	name, _, _ = strings.Cut(name, "/")
	if n, err := url.PathUnescape(name); err == nil {
		name = n
	}
	singular := strings.TrimSuffix(kind, "s")
	switch {
	case code == "not_found" && (kind == "queues" || kind == "exchanges") && name != "":
		decl := "warrenctl queue declare " + name
		if kind == "exchanges" {
			decl = "warrenctl exchange declare " + name + " --type TYPE"
		}
		return fmt.Sprintf(" (list them with: warrenctl %s list; declare it with: %s)", singular, decl)
	case code == "not_found" && kind == "bindings":
		return " (declare the exchange and the queue first; see warrenctl exchange list, warrenctl queue list)"
	}
	return ""
}

// show prints v as JSON, or as a table via render.
func (c *cli) show(raw json.RawMessage, render func(w *tabwriter.Writer) error) error {
	if c.jsonOut {
		_, err := c.out.Write(raw)
		return err
	}
	w := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	if err := render(w); err != nil {
		return err
	}
	return w.Flush()
}

func (c *cli) status() error {
	var raw json.RawMessage
	if err := c.call("GET", "/api/overview", nil, &raw); err != nil {
		return err
	}
	return c.showFields(raw)
}

// showFields prints a JSON object as "key<TAB>value" lines, sorted by
// key with "name" first; nested objects become dotted keys (rates.publish)
// and rates get their unit.
func (c *cli) showFields(raw json.RawMessage) error {
	var o map[string]any
	if err := json.Unmarshal(raw, &o); err != nil {
		return fmt.Errorf("admin API: unexpected reply: %w", err)
	}
	fields := map[string]string{}
	flatten("", o, fields)
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if (keys[i] == "name") != (keys[j] == "name") {
			return keys[i] == "name"
		}
		return keys[i] < keys[j]
	})
	return c.show(raw, func(w *tabwriter.Writer) error {
		for _, k := range keys {
			fmt.Fprintf(w, "%s\t%s\n", k, fields[k])
		}
		return nil
	})
}

func flatten(prefix string, v any, out map[string]string) {
	switch x := v.(type) {
	case map[string]any:
		if len(x) == 0 && prefix != "" {
			out[prefix] = "-"
		}
		for k, e := range x {
			if prefix != "" {
				k = prefix + "." + k
			}
			flatten(k, e, out)
		}
	case []any:
		b, _ := json.Marshal(x)
		out[prefix] = string(b)
	default:
		s := fmtVal(x)
		if strings.HasPrefix(prefix, "rates.") {
			s += "/s"
		}
		out[prefix] = s
	}
}

func fmtVal(v any) string {
	if f, ok := v.(float64); ok && f == float64(int64(f)) {
		return strconv.FormatInt(int64(f), 10)
	}
	return fmt.Sprint(v)
}

// inVhost is path (an admin API resource path) in the virtual host --url
// names: "/"'s paths need nothing, another's take ?vhost=.
func (c *cli) inVhost(path string) string {
	if c.vhost == "/" {
		return path
	}
	return path + "?vhost=" + url.QueryEscape(c.vhost)
}

// nodeOrDash shows a node id, or "-" for none.
func nodeOrDash(id uint64) string {
	if id == 0 {
		return "-"
	}
	return strconv.FormatUint(id, 10)
}

// nodesOrDash shows node ids as 1,2,3, or "-" for none.
func nodesOrDash(ids []uint64) string {
	if len(ids) == 0 {
		return "-"
	}
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = strconv.FormatUint(id, 10)
	}
	return strings.Join(s, ",")
}

// plural says n and noun, with an s unless n is 1: "1 message", "2 messages".
func plural(n int64, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
