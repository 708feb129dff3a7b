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
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/warren-mq/warren/client"
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
	apiDerived       bool // api is defaultAPI's guess: neither --api nor WARREN_API gave it
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
		c.apiDerived = true
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
