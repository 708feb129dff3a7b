// Command warrenctl operates a Warren broker from a shell: topology,
// inspection, publishing and consuming, dead-letter peek and replay.
//
//	warrenctl [--url warren(s)://user:pass@host:5680] [--api http(s)://host:15680] [--ca FILE] [--json] COMMAND ...
//
// Topology and inspection go through the admin HTTP API (--api, default:
// the --url host on port 15680 with the same credentials); publish and
// consume speak the native protocol (--url, or WARREN_URL). Run
// `warrenctl help` for the commands.
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/warren-mq/warren/admin/api"
	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/wire"
)

// usage is the help text; its queue settings line is written from wire's
// queue-argument descriptors (queueSettingsUsage).
var usage = strings.Replace(strings.Replace(usageText, "{{queue settings}}", queueSettingsUsage(), 1), "{{vhost}}", vhostUsage, 1)

const usageText = `warrenctl — operate a Warren broker

Global flags (before or after the command):
  --url URL    native protocol URL (env WARREN_URL; default warren://guest:guest@127.0.0.1:5680;
               warrens://… is TLS, port 5681); its path names the virtual host the exchange, queue,
               binding, publish, consume and dlq commands work in (…:5680/staging; none or %2F: "/")
  --api URL    admin API URL (env WARREN_API; default: the --url host, on the --url port + 10000:
               http://HOST:15680 for :5680, https://HOST:15681 for warrens://…:5681); a user in it (https://USER:PASS@HOST:15681)
               logs in to the admin API, else --url's user does (the admin API needs a password user)
  --ca FILE    PEM CA to verify the broker's TLS certificate with, on both (env WARREN_CA)
  --cert FILE, --key FILE  a client certificate for mutual TLS (env WARREN_CERT, WARREN_KEY);
               with no user in a warrens:// URL, the native protocol logs in as its CN (EXTERNAL)
  --json       print JSON instead of tables

Commands:
  status
  exchange list | declare NAME --type TYPE [--durable] [--auto-delete] [--internal] [--alternate EX] | delete NAME
  queue list | show NAME | declare NAME [settings] | delete NAME | purge NAME | get NAME [--count N]
{{queue settings}}  binding list | add --exchange EX (--queue Q | --to-exchange EX) --routing-key KEY | delete (same flags)
  connection list | close ID
  user list | add NAME [--tags T1,T2] | set-password NAME | set-tags NAME [TAG...] | delete NAME
      add and set-password read the password from stdin (one line), never from the command line.
      Deleting a user closes its connections. The administrator tag allows every write.
  permission list | set USER [--vhost /] [--configure RE] [--write RE] [--read RE] | clear USER [--vhost /]
      RabbitMQ's regular expressions over exchange and queue names; an omitted or empty one matches nothing.
{{vhost}}  publish [--exchange EX] --routing-key KEY [--persistent] [--mandatory=false] [--priority N] [--content-type T]
          [--message-id ID] [--header k=v]... [--lines | --raw] [--file F] [BODY]   (body from stdin when absent)
      A body read from stdin or --file loses one trailing newline (as from echo); --raw keeps the exact
      bytes. --lines publishes each line as a message.
      The default exchange ("") delivers to the queue named by the routing key. A message that no queue
      takes fails the command (exit 1); --mandatory=false lets it be dropped silently instead.
  consume QUEUE [--count N] [--requeue | --reject] [--timeout D] [--window W]   (prints each body on its own line)
      Takes exactly N messages (default 1) and acks them; --reject dead-letters them instead.
      --requeue hands them back to the head of the queue, which counts as a failed delivery: their
      delivery and failed counts grow, and a queue with --delivery-limit dead-letters a message handed
      back too often; it takes at most W. To look without touching anything, use queue get.
      --timeout: give up when no message has come for this long, or the subscribe is not answered in it (default 5s).
      --window: messages asked for at once (default 1000, the broker's default max_prefetch; set it
      to the broker's max_prefetch if that is lower).
  dlq peek QUEUE [--count N] | dlq replay QUEUE [--count N | --ids ID,…] [--rate R]
      peek is queue get (nothing is delivered or counted); replay sends each message back to the
      exchange and routing key it died from.
  purge QUEUE
  cluster status   (the nodes, the metadata group's leader and term, and how far this node has applied it)
  cluster join ADDR NODE      (add node NODE, cluster port ADDR: a learner, then a voter once caught up)
  cluster leave NODE          (remove node NODE for good: it stops, its id is never reused; its queue replicas are re-placed on the others)
  cluster decommission NODE   (move every queue replica off NODE, then remove it: no queue runs a replica short)
  cluster transfer-leadership [NODE]  (hand the metadata leadership to NODE, default the most caught-up voter)

Exit codes: 0 success, 1 failure, 2 usage error.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr))
}

type cli struct {
	url, api string
	// TLS: --ca (a private CA to trust), --cert and --key (a client
	// certificate); tlsCfg is built from them for warrens:// and https://.
	ca, cert, key string
	tlsCfg        *tls.Config
	user, pass    string
	// apiUser, apiPass log in to the admin API: the user in --api, else
	// --url's.
	apiUser, apiPass string
	apiDefaultUser   bool // neither --url nor --api named a user
	// vhost is the virtual host --url's path names ("/" when none):
	// resource commands ask the admin API about it (inVhost) and the
	// native protocol opens it.
	vhost     string
	jsonOut   bool
	stdin     io.Reader
	out, errw io.Writer
	ctx       context.Context
}

// defaultAPI is the admin API URL beside the native address addr: the
// same host, the port 10,000 above the native one (5680 → 15680, TLS
// 5681 → 15681, a cluster's node 2 on 5690 → 15690), https for a
// warrens:// URL; 15680 (15681) when that would be past 65535.
func defaultAPI(addr string, tls bool) string {
	host, port, _ := net.SplitHostPort(addr)
	scheme, api := "http", 15680
	if tls {
		scheme, api = "https", 15681
	}
	if p, err := strconv.Atoi(port); err == nil && p+10000 <= 65535 {
		api = p + 10000
	}
	return scheme + "://" + net.JoinHostPort(host, strconv.Itoa(api))
}

// usageErr is a mistake on the command line (exit 2).
type usageErr struct{ msg string }

func (e usageErr) Error() string { return e.msg }

func run(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) int {
	c := &cli{stdin: stdin, out: stdout, errw: stderr, ctx: ctx}
	rest, err := c.globals(args)
	if err != nil {
		fmt.Fprintf(stderr, "warrenctl: %v\n\nusage: %s", err, usage)
		return 2
	}
	if len(rest) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	if rest[0] == "help" || rest[0] == "-h" || rest[0] == "--help" || rest[0] == "-help" {
		fmt.Fprint(stdout, usage)
		return 0
	}
	if c.url == "" {
		c.url = getenv("WARREN_URL")
	}
	if c.url == "" {
		c.url = "warren://guest:guest@127.0.0.1:5680"
	}
	if c.api == "" {
		c.api = getenv("WARREN_API")
	}
	addr, user, pass, err := client.ParseURL(c.url)
	if err != nil {
		fmt.Fprintln(stderr, "warrenctl:", err)
		return 2
	}
	c.user, c.pass = user, pass
	if c.api == "" {
		c.api = defaultAPI(addr, strings.HasPrefix(c.url, "warrens:"))
	}
	c.apiUser, c.apiPass = user, pass
	c.vhost = "/"
	if u, err := url.Parse(c.url); err == nil {
		if u.User == nil {
			c.apiDefaultUser = true // guest, or a client certificate's login
		}
		if v := strings.TrimPrefix(u.Path, "/"); v != "" {
			c.vhost = v // decoded: %2F is "/"
		}
	}
	if u, err := url.Parse(c.api); err == nil && u.User != nil {
		c.apiDefaultUser = false
		// Credentials in --api are the admin API's; they stay out of
		// the URL that errors print.
		c.apiUser = u.User.Username()
		c.apiPass, _ = u.User.Password()
		u.User = nil
		c.api = u.String()
	}
	for _, v := range []struct {
		dst      *string
		env, flg string
	}{{&c.ca, "WARREN_CA", "ca"}, {&c.cert, "WARREN_CERT", "cert"}, {&c.key, "WARREN_KEY", "key"}} {
		if *v.dst == "" {
			*v.dst = getenv(v.env)
		}
	}
	if c.ca != "" || c.cert != "" || c.key != "" {
		if c.tlsCfg, err = client.LoadTLS(c.ca, c.cert, c.key); err != nil {
			fmt.Fprintln(stderr, "warrenctl:", err)
			return 2
		}
	}
	err = c.dispatch(rest)
	var ue usageErr
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "warrenctl: %v\n\nusage:\n%s\nRun 'warrenctl help' for every command.\n", err, usageOf(rest[0]))
		return 2
	default:
		fmt.Fprintf(stderr, "warrenctl: %v\n", err)
		return 1
	}
}

// globals takes the global flags (--url, --api, --json) out of args,
// wherever they are before a "--", and returns the rest.
func (c *cli) globals(args []string) ([]string, error) {
	var rest []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return append(rest, args[i:]...), nil
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") {
			name = ""
		}
		switch name {
		case "url", "api", "ca", "cert", "key":
			if !hasVal {
				if i+1 == len(args) {
					return nil, fmt.Errorf("flag needs an argument: %s", a)
				}
				i++
				val = args[i]
			}
			switch name {
			case "url":
				c.url = val
			case "api":
				c.api = val
			case "ca":
				c.ca = val
			case "cert":
				c.cert = val
			case "key":
				c.key = val
			}
		case "json":
			c.jsonOut = true
			if hasVal {
				b, err := strconv.ParseBool(val)
				if err != nil {
					return nil, fmt.Errorf("invalid boolean value %q for --json", val)
				}
				c.jsonOut = b
			}
		default:
			if len(rest) == 0 && strings.HasPrefix(a, "-") && a != "-h" && a != "--help" && a != "-help" {
				return nil, fmt.Errorf("unknown global flag %s", a)
			}
			rest = append(rest, a)
		}
	}
	return rest, nil
}

// usageOf returns the lines of the usage text for one command.
func usageOf(cmd string) string {
	_, cmds, _ := strings.Cut(usage, "Commands:\n")
	var b strings.Builder
	in := false
	for _, line := range strings.Split(cmds, "\n") {
		switch {
		case strings.HasPrefix(line, "  ") && !strings.HasPrefix(line, "   "):
			f := strings.Fields(line)
			in = len(f) > 0 && f[0] == cmd
		case !strings.HasPrefix(line, "   "):
			in = false
		}
		if in {
			b.WriteString(line + "\n")
		}
	}
	if b.Len() == 0 {
		return cmds
	}
	return b.String()
}

func (c *cli) dispatch(args []string) error {
	sub := func(i int) string {
		if len(args) > i {
			return args[i]
		}
		return ""
	}
	switch args[0] {
	case "status":
		if err := none("status", args[1:]); err != nil {
			return err
		}
		return c.status()
	case "exchange":
		return c.exchange(sub(1), args[min(2, len(args)):])
	case "queue":
		return c.queue(sub(1), args[min(2, len(args)):])
	case "binding":
		return c.binding(sub(1), args[min(2, len(args)):])
	case "connection":
		return c.connection(sub(1), args[min(2, len(args)):])
	case "user":
		return c.users(sub(1), args[min(2, len(args)):])
	case "permission":
		return c.permissions(sub(1), args[min(2, len(args)):])
	case "cluster":
		return c.cluster(sub(1), args[min(2, len(args)):])
	case "vhost":
		return c.vhosts(sub(1), args[min(2, len(args)):])
	case "publish":
		return c.publish(args[1:])
	case "consume":
		return c.consume(args[1:])
	case "purge":
		return c.queue("purge", args[1:])
	case "dlq":
		switch sub(1) {
		case "peek":
			return c.queue("get", args[2:])
		case "replay":
			return c.replay(args[2:])
		}
		return usageErr{"dlq: want peek or replay"}
	}
	return usageErr{"unknown command " + strconv.Quote(args[0]) + " (see warrenctl help)"}
}

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

func flags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

// parse parses flags that may come before or after positional arguments;
// after "--" everything is positional. Unknown flags are usage errors.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, usageErr{fs.Name() + ": " + err.Error()}
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// one parses args that take no flags and exactly one name.
func one(name string, args []string) (string, error) {
	pos, err := parse(flags(name), args)
	if err != nil {
		return "", err
	}
	if len(pos) != 1 {
		return "", usageErr{name + ": want exactly one name"}
	}
	return pos[0], nil
}

// none parses args that take no flags and no names.
func none(name string, args []string) error {
	pos, err := parse(flags(name), args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usageErr{name + ": unexpected argument " + strconv.Quote(pos[0])}
	}
	return nil
}

// oneOf wants exactly one name among positional arguments already parsed.
func oneOf(name string, pos []string) (string, error) {
	if len(pos) != 1 {
		return "", usageErr{name + ": want exactly one name"}
	}
	return pos[0], nil
}

func (c *cli) exchange(verb string, args []string) error {
	switch verb {
	case "list":
		if err := none("exchange list", args); err != nil {
			return err
		}
		var raw json.RawMessage
		if err := c.call("GET", c.inVhost("/api/exchanges"), nil, &raw); err != nil {
			return err
		}
		var xs []api.Exchange
		_ = json.Unmarshal(raw, &xs)
		return c.show(raw, func(w *tabwriter.Writer) error {
			fmt.Fprintln(w, "NAME\tTYPE\tDURABLE\tALTERNATE")
			for _, x := range xs {
				fmt.Fprintf(w, "%v\t%v\t%v\t%v\n", x.Name, x.Type, x.Durable, orDash(x.Alternate))
			}
			return nil
		})
	case "declare":
		fs := flags("exchange declare")
		typ := fs.String("type", "", "")
		durable := fs.Bool("durable", false, "")
		autoDel := fs.Bool("auto-delete", false, "")
		internal := fs.Bool("internal", false, "")
		alt := fs.String("alternate", "", "")
		pos, err := parse(fs, args)
		if err != nil {
			return err
		}
		name, err := oneOf("exchange declare", pos)
		if err != nil {
			return err
		}
		if *typ == "" {
			return usageErr{"exchange declare: --type is required"}
		}
		body := api.ExchangeSettings{Type: *typ, Durable: *durable, AutoDelete: *autoDel, Internal: *internal, Alternate: *alt}
		if err := c.call("PUT", c.inVhost("/api/exchanges/"+url.PathEscape(name)), body, nil); err != nil {
			return err
		}
		fmt.Fprintf(c.errw, "exchange %s declared\n", name)
		return nil
	case "delete":
		name, err := one("exchange delete", args)
		if err != nil {
			return err
		}
		if err := c.call("DELETE", c.inVhost("/api/exchanges/"+url.PathEscape(name)), nil, nil); err != nil {
			return err
		}
		fmt.Fprintf(c.errw, "exchange %s deleted\n", name)
		return nil
	}
	return usageErr{"exchange: want list, declare or delete"}
}

func orDash(v any) any {
	if v == nil || v == "" {
		return "-"
	}
	return v
}

func (c *cli) queue(verb string, args []string) error {
	switch verb {
	case "list":
		if err := none("queue list", args); err != nil {
			return err
		}
		var raw json.RawMessage
		if err := c.call("GET", c.inVhost("/api/queues"), nil, &raw); err != nil {
			return err
		}
		var qs []api.Queue
		_ = json.Unmarshal(raw, &qs)
		return c.show(raw, func(w *tabwriter.Writer) error {
			fmt.Fprintln(w, "NAME\tREADY\tUNACKED\tCONSUMERS\tPUBLISH/S\tDELIVER/S\tACK/S\tLEADER\tREPLICAS")
			for _, q := range qs {
				fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\n", q.Name, q.Ready, q.Unacked, q.Consumers,
					fmtVal(q.Rates.Publish), fmtVal(q.Rates.Deliver), fmtVal(q.Rates.Ack), nodeOrDash(q.Leader), nodesOrDash(q.Replicas))
			}
			return nil
		})
	case "show":
		name, err := one("queue show", args)
		if err != nil {
			return err
		}
		var raw json.RawMessage
		if err := c.call("GET", c.inVhost("/api/queues/"+url.PathEscape(name)), nil, &raw); err != nil {
			return err
		}
		return c.showFields(raw)
	case "declare":
		fs := flags("queue declare")
		durable := fs.Bool("durable", false, "")
		autoDel := fs.Bool("auto-delete", false, "")
		var set wire.Table // the queue arguments given, in flag order
		queueArgFlags(fs, &set)
		pos, err := parse(fs, args)
		if err != nil {
			return err
		}
		name, err := oneOf("queue declare", pos)
		if err != nil {
			return err
		}
		body := api.QueueSettings{Durable: *durable, AutoDelete: *autoDel, QueueArgs: api.QueueArgsOf(set)}
		if err := c.call("PUT", c.inVhost("/api/queues/"+url.PathEscape(name)), body, nil); err != nil {
			return err
		}
		fmt.Fprintf(c.errw, "queue %s declared\n", name)
		return nil
	case "delete":
		name, err := one("queue delete", args)
		if err != nil {
			return err
		}
		var r api.Deleted
		if err := c.call("DELETE", c.inVhost("/api/queues/"+url.PathEscape(name)), nil, &r); err != nil {
			return err
		}
		fmt.Fprintf(c.errw, "queue %s deleted (%s)\n", name, plural(r.Messages, "message"))
		return nil
	case "purge":
		name, err := one("purge", args)
		if err != nil {
			return err
		}
		var r api.Purged
		if err := c.call("POST", c.inVhost("/api/queues/"+url.PathEscape(name)+"/purge"), nil, &r); err != nil {
			return err
		}
		fmt.Fprintf(c.out, "%d\n", r.Messages)
		return nil
	case "get":
		fs := flags("queue get")
		count := fs.Int("count", 10, "")
		pos, err := parse(fs, args)
		if err != nil {
			return err
		}
		name, err := oneOf("queue get", pos)
		if err != nil {
			return err
		}
		var raw json.RawMessage
		if err := c.call("POST", c.inVhost("/api/queues/"+url.PathEscape(name)+"/get"), api.CountRequest{Count: *count}, &raw); err != nil {
			return err
		}
		var r api.Messages
		_ = json.Unmarshal(raw, &r)
		return c.show(raw, func(w *tabwriter.Writer) error {
			fmt.Fprintln(w, "#\tID\tEXCHANGE\tROUTING KEY\tDELIVERIES\tDIED\tBODY")
			for i, m := range r.Messages {
				died := "-"
				if m.Properties != nil && len(m.Properties.Deaths) > 0 {
					d := m.Properties.Deaths[0]
					// EXCHANGE is the one it was last published to (a dead
					// letter's: the dead-letter exchange); where it was first
					// published is in its oldest death.
					from := m.Properties.Deaths[len(m.Properties.Deaths)-1].Exchange
					if from == "" {
						from = "(default)"
					}
					died = fmt.Sprintf("%s in %s ×%d, first published to %s", d.Reason, d.Queue, d.Count, from)
				}
				fmt.Fprintf(w, "%d\t%d\t%s\t%s\t%d\t%s\t%s\n", i+1, m.ID, orDash(m.Exchange), m.RoutingKey, m.DeliveryCount, died, printable(m.Body))
			}
			return nil
		})
	}
	return usageErr{"queue: want list, show, declare, delete, purge or get"}
}

func printable(b []byte) string {
	s := string(b)
	if len(s) > 60 {
		s = s[:60] + "…"
	}
	return strconv.Quote(s)
}

func (c *cli) binding(verb string, args []string) error {
	if verb == "list" {
		if err := none("binding list", args); err != nil {
			return err
		}
		var raw json.RawMessage
		if err := c.call("GET", c.inVhost("/api/bindings"), nil, &raw); err != nil {
			return err
		}
		var bs []api.Binding
		_ = json.Unmarshal(raw, &bs)
		return c.show(raw, func(w *tabwriter.Writer) error {
			fmt.Fprintln(w, "EXCHANGE\tDESTINATION\tROUTING KEY")
			for _, b := range bs {
				dest := b.Queue
				if dest == "" {
					dest = "exchange " + b.DestinationExchange
				}
				fmt.Fprintf(w, "%s\t%s\t%s\n", b.Exchange, dest, b.RoutingKey)
			}
			return nil
		})
	}
	if verb != "add" && verb != "delete" {
		return usageErr{"binding: want list, add or delete"}
	}
	fs := flags("binding " + verb)
	ex := fs.String("exchange", "", "")
	q := fs.String("queue", "", "")
	toEx := fs.String("to-exchange", "", "")
	key := fs.String("routing-key", "", "")
	if _, err := parse(fs, args); err != nil {
		return err
	}
	if *ex == "" || (*q == "") == (*toEx == "") {
		return usageErr{"binding " + verb + ": want --exchange and one of --queue, --to-exchange"}
	}
	body := api.Binding{Exchange: *ex, Queue: *q, DestinationExchange: *toEx, RoutingKey: *key}
	method, did := "PUT", "added"
	if verb == "delete" {
		method, did = "DELETE", "deleted"
	}
	if err := c.call(method, c.inVhost("/api/bindings"), body, nil); err != nil {
		return err
	}
	dest := "queue " + strconv.Quote(*q)
	if *q == "" {
		dest = "exchange " + strconv.Quote(*toEx)
	}
	fmt.Fprintf(c.errw, "binding %s: exchange %q → %s, routing key %q\n", did, *ex, dest, *key)
	return nil
}

func (c *cli) connection(verb string, args []string) error {
	switch verb {
	case "list":
		if err := none("connection list", args); err != nil {
			return err
		}
		var raw json.RawMessage
		if err := c.call("GET", "/api/connections", nil, &raw); err != nil {
			return err
		}
		var cs []map[string]any
		_ = json.Unmarshal(raw, &cs)
		return c.show(raw, func(w *tabwriter.Writer) error {
			fmt.Fprintln(w, "ID\tUSER\tREMOTE\tCHANNELS")
			for _, x := range cs {
				fmt.Fprintf(w, "%s\t%v\t%v\t%s\n", fmtVal(x["id"]), orDash(x["user"]), x["remote"], fmtVal(x["channels"]))
			}
			return nil
		})
	case "close":
		id, err := one("connection close", args)
		if err != nil {
			return err
		}
		if err := c.call("DELETE", "/api/connections/"+url.PathEscape(id), nil, nil); err != nil {
			return err
		}
		fmt.Fprintf(c.errw, "connection %s closed\n", id)
		return nil
	}
	return usageErr{"connection: want list or close"}
}

func (c *cli) replay(args []string) error {
	fs := flags("dlq replay")
	count := fs.Int("count", 0, "")
	rate := fs.Float64("rate", 0, "")
	idList := fs.String("ids", "", "")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	name, err := oneOf("dlq replay", pos)
	if err != nil {
		return err
	}
	req := api.CountRequest{Count: *count, Rate: *rate}
	if *idList != "" {
		for _, f := range strings.Split(*idList, ",") {
			id, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
			if err != nil {
				return usageErr{fmt.Sprintf("dlq replay --ids: %q is not a message id: give the ids dlq peek shows, separated by commas", f)}
			}
			req.IDs = append(req.IDs, id)
		}
	}
	var raw json.RawMessage
	if err := c.call("POST", c.inVhost("/api/queues/"+url.PathEscape(name)+"/replay"), req, &raw); err != nil {
		return err
	}
	var r api.ReplayResult
	_ = json.Unmarshal(raw, &r)
	if err := c.show(raw, func(w *tabwriter.Writer) error {
		fmt.Fprintf(w, "moved\t%d\nskipped\t%d\n", r.Moved, r.Skipped)
		if req.IDs != nil {
			fmt.Fprintf(w, "missing\t%d\n", r.Missing)
		}
		return nil
	}); err != nil {
		return err
	}
	if r.Error != "" {
		return errors.New("replay stopped early: " + r.Error)
	}
	return nil
}

// inVhost is path (an admin API resource path) in the virtual host --url
// names: "/"'s paths need nothing, another's take ?vhost=.
func (c *cli) inVhost(path string) string {
	if c.vhost == "/" {
		return path
	}
	return path + "?vhost=" + url.QueryEscape(c.vhost)
}

// ---- native protocol ----

func (c *cli) dial() (*client.Conn, *client.Channel, error) {
	ctx, cancel := context.WithTimeout(c.ctx, 10*time.Second)
	defer cancel()
	conn, err := client.Dial(ctx, c.url, client.Options{Name: "warrenctl", TLS: c.tlsCfg})
	if err != nil {
		return nil, nil, fmt.Errorf("connect %s: %s", redact(c.url), protoErr(err))
	}
	ch, err := conn.Channel(ctx)
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	return conn, ch, nil
}

func redact(u string) string {
	p, err := url.Parse(u)
	if err != nil || p.User == nil {
		return u
	}
	p.User = url.User(p.User.Username())
	return p.String()
}

type headerFlags []string

func (h *headerFlags) String() string     { return strings.Join(*h, ",") }
func (h *headerFlags) Set(s string) error { *h = append(*h, s); return nil }

func (c *cli) publish(args []string) error {
	fs := flags("publish")
	ex := fs.String("exchange", "", "")
	key := fs.String("routing-key", "", "")
	persistent := fs.Bool("persistent", false, "")
	mandatory := fs.Bool("mandatory", true, "")
	prio := fs.Uint("priority", 0, "")
	ctype := fs.String("content-type", "", "")
	msgID := fs.String("message-id", "", "")
	lines := fs.Bool("lines", false, "")
	file := fs.String("file", "", "")
	raw := fs.Bool("raw", false, "")
	var hdrs headerFlags
	fs.Var(&hdrs, "header", "")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if *prio > 255 {
		return usageErr{"publish: --priority must be 0-255"}
	}
	if *raw && *lines {
		return usageErr{"publish: --raw and --lines exclude each other (--lines takes each line without its newline)"}
	}
	var props *wire.Props
	if *ctype != "" || *msgID != "" || len(hdrs) > 0 {
		props = &wire.Props{ContentType: *ctype, MessageID: *msgID}
		for _, h := range hdrs {
			k, v, ok := strings.Cut(h, "=")
			if !ok {
				return usageErr{"publish: --header wants key=value"}
			}
			props.Headers = append(props.Headers, wire.Field{Key: k, Value: wire.String(v)})
		}
	}
	var bodies [][]byte
	switch {
	case len(pos) > 1:
		return usageErr{"publish: at most one BODY argument (use --lines for many messages)"}
	case len(pos) == 1:
		if *raw {
			return usageErr{"publish: --raw is for a body read from stdin or --file (a BODY argument is published as given)"}
		}
		bodies = [][]byte{[]byte(pos[0])}
	default:
		var r io.Reader = c.stdin
		if *file != "" {
			f, err := os.Open(*file)
			if err != nil {
				return err
			}
			defer f.Close()
			r = f
		}
		if *lines {
			sc := bufio.NewScanner(r)
			sc.Buffer(make([]byte, 64<<10), 64<<20)
			for sc.Scan() {
				bodies = append(bodies, append([]byte(nil), sc.Bytes()...))
			}
			if err := sc.Err(); err != nil {
				return err
			}
		} else {
			b, err := io.ReadAll(r)
			if err != nil {
				return err
			}
			if !*raw {
				// `echo hello | warrenctl publish` publishes "hello", as
				// the BODY argument would: one trailing newline (\n or
				// \r\n) goes.
				if t, ok := bytes.CutSuffix(b, []byte("\n")); ok {
					b = bytes.TrimSuffix(t, []byte("\r"))
				}
			}
			bodies = [][]byte{b}
		}
	}
	conn, ch, err := c.dial()
	if err != nil {
		return err
	}
	defer conn.Close()
	var returned atomic.Int64
	var returnCode atomic.Uint32
	ch.NotifyReturn(func(r client.Return) {
		returned.Add(1)
		returnCode.Store(uint32(r.Code))
	})
	ctx, cancel := context.WithTimeout(c.ctx, time.Minute)
	defer cancel()
	var ms []client.Message
	for _, b := range bodies {
		ms = append(ms, client.Message{RoutingKey: *key, Body: b, Persistent: *persistent, Mandatory: *mandatory, Priority: uint8(*prio), Props: props})
	}
	if err := ch.PublishBatch(ctx, *ex, ms); err != nil {
		var we *wire.Error
		if errors.As(err, &we) && we.Code == wire.ExchangeNotFound {
			return fmt.Errorf("publish: %s (warrenctl exchange declare %s --type TYPE)", protoErr(err), *ex)
		}
		if errors.As(err, &we) && we.Code == wire.AccessRefused {
			// A nack carries no text: say what permission it needs.
			name := *ex
			if name == "" {
				name = "amq.default" // the default exchange's name in permissions
			}
			return fmt.Errorf("publish: %s (publishing needs write permission on exchange %q in vhost %q: warrenctl permission set USER --vhost %s --write ...)", protoErr(err), name, c.vhost, c.vhost)
		}
		return fmt.Errorf("publish: %s", protoErr(err))
	}
	n := returned.Load()
	if n == 0 {
		fmt.Fprintf(c.errw, "published %d message(s), all confirmed\n", len(ms))
		return nil
	}
	// RETURNs come before the confirms of the same messages (spec §8.3).
	what := fmt.Sprintf("%d of %d message(s) reached no queue and were not stored", n, len(ms))
	switch {
	case wire.Code(returnCode.Load()) != wire.NoRoute:
		return fmt.Errorf("%s: %s", what, wire.Code(returnCode.Load()))
	case *ex == "":
		return fmt.Errorf("%s: no queue %q (the default exchange delivers to the queue named by the routing key; declare it with: warrenctl queue declare %s)", what, *key, *key)
	default:
		return fmt.Errorf("%s: exchange %q matched no binding for routing key %q (add one with: warrenctl binding add --exchange %s --queue QUEUE --routing-key KEY)", what, *ex, *key, *ex)
	}
}

// protoErr prints a protocol error as "code: reason", without the Go
// package prefix.
func protoErr(err error) string {
	var we *wire.Error
	if errors.As(err, &we) {
		return we.Code.String() + ": " + we.Reason
	}
	return err.Error()
}

// consumeWindow is the most deliveries consume asks for at once by
// default (--window): the broker's default cap on a consumer's prefetch
// (Config.MaxPrefetch). A broker configured with a lower cap delivers
// fewer per window, and a count above that cap then stops at the
// --timeout unless --window is set to the cap.
const consumeWindow = 1000

// consume takes exactly count messages. It never lets the broker push a
// message it does not want: each window subscribes with a prefetch of what
// is still wanted (at most consumeWindow) and settles nothing until the
// window is full, so the broker cannot send more; then it cancels the
// consumer and only then settles. A message delivered and then taken back
// on close would count as a failed delivery (and a delivery-limit queue
// dead-letters those).
func (c *cli) consume(args []string) error {
	fs := flags("consume")
	count := fs.Int("count", 1, "")
	requeue := fs.Bool("requeue", false, "")
	reject := fs.Bool("reject", false, "")
	timeout := fs.Duration("timeout", 5*time.Second, "")
	window := fs.Int("window", consumeWindow, "")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	name, err := oneOf("consume", pos)
	if err != nil {
		return err
	}
	switch {
	case *requeue && *reject:
		return usageErr{"consume: --requeue and --reject exclude each other"}
	case *count < 1:
		return usageErr{"consume: --count must be at least 1"}
	case *window < 1:
		return usageErr{"consume: --window must be at least 1"}
	case *requeue && *count > *window:
		// Requeued messages go back to the head of the queue: a second
		// window would take the same ones again.
		return usageErr{fmt.Sprintf("consume: --requeue takes at most --window (%d) messages; to look at more without taking them, use queue get", *window)}
	case *timeout <= 0:
		return usageErr{"consume: --timeout must be positive"}
	}
	conn, ch, err := c.dial()
	if err != nil {
		return err
	}
	defer conn.Close()
	got := 0
	for got < *count {
		want := min(*count-got, *window)
		n, err := c.consumeWindow(ch, name, want, *timeout, *requeue, *reject)
		got += n
		if err != nil {
			return err
		}
		if n < want {
			why := ""
			if n > 0 {
				why = fmt.Sprintf("; if the queue still has messages, the broker's max_prefetch may be below %d: set --window to it", want)
			}
			return fmt.Errorf("got %d of %d messages: none came for %v (--timeout)%s", got, *count, *timeout, why)
		}
	}
	return nil
}

// consumeWindow subscribes with prefetch want, takes up to want deliveries
// (fewer when none comes for timeout), cancels the consumer, then settles
// what it took. It returns how many it took.
func (c *cli) consumeWindow(ch *client.Channel, queue string, want int, timeout time.Duration, requeue, reject bool) (int, error) {
	// The subscribe's answer is waited for --timeout too (a broker that
	// never answers it fails the command then, not 10 s later).
	ctx, cancel := context.WithTimeout(c.ctx, timeout)
	defer cancel()
	cs, err := ch.Consume(ctx, queue, client.ConsumeOptions{Prefetch: uint32(want)})
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) && c.ctx.Err() == nil {
			return 0, fmt.Errorf("consume: the broker did not answer the subscribe to queue %q within %v (--timeout)", queue, timeout)
		}
		return 0, consumeErr(queue, err)
	}
	var got []*client.Delivery
	take := func(d *client.Delivery) {
		got = append(got, d)
		if c.jsonOut {
			p, _ := d.Props()
			b, _ := json.Marshal(map[string]any{"exchange": d.Exchange, "routing_key": d.RoutingKey, "redelivered": d.Redelivered,
				"delivery_count": d.DeliveryCount, "properties": p, "body": string(d.Body)})
			fmt.Fprintf(c.out, "%s\n", b)
		} else {
			fmt.Fprintf(c.out, "%s\n", d.Body)
		}
	}
	idle := time.NewTimer(timeout)
	defer idle.Stop()
	var stopped error
	gone := false // the broker cancelled the consumer (its feed is closed)
wait:
	for len(got) < want {
		select {
		case d, ok := <-cs.Deliveries():
			if !ok {
				gone, stopped = true, fmt.Errorf("consumer stopped: %v", cs.Err())
				break wait
			}
			take(d)
			idle.Reset(timeout)
		case <-idle.C:
			break wait
		case <-c.ctx.Done():
			stopped = c.ctx.Err()
			break wait
		}
	}
	if !gone {
		// Also on an interrupt: Cancel closes the feed whatever the reply.
		cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := cs.Cancel(cctx)
		ccancel()
		if err != nil && stopped == nil {
			stopped = fmt.Errorf("cancel consumer: %s", protoErr(err))
		}
	}
	// Deliveries the broker sent before it took the cancel are in the
	// feed (never more than the window): take them too.
	for d := range cs.Deliveries() {
		if len(got) < want {
			take(d)
		}
	}
	c.settle(got, requeue, reject)
	if len(got) > 0 && !gone {
		// SETTLE has no reply, and the broker's queue owner applies it
		// after the connection has read it: without waiting, warrenctl
		// could exit (and a following warrenctl dlq peek find nothing)
		// before the rejects were dead-lettered. A passive declare is
		// answered by the queue's owner after what was submitted to it
		// before (spec/PROTOCOL.md §7.2), so once it is answered the
		// settlements have taken effect.
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := ch.DeclareQueue(sctx, queue, client.QueueOptions{Passive: true})
		scancel()
		if err != nil && stopped == nil {
			stopped = fmt.Errorf("settle: %s", protoErr(err))
		}
	}
	return len(got), stopped
}

// consumeErr says what to do about a failed subscribe.
func consumeErr(queue string, err error) error {
	if wire.CodeOf(err) == wire.NotFound {
		return fmt.Errorf("consume: no queue %q (see warrenctl queue list; declare it with: warrenctl queue declare %s)", queue, queue)
	}
	return fmt.Errorf("consume: %s", protoErr(err))
}

func (c *cli) settle(ds []*client.Delivery, requeue, reject bool) {
	for _, d := range ds {
		switch {
		case requeue:
			_ = d.Nack(true)
		case reject:
			_ = d.Reject()
		default:
			_ = d.Ack()
		}
	}
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
