package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/warren-mq/warren/admin/api"
	"github.com/warren-mq/warren/wire"
)

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
		// In a cluster the counts are the answering node's replica's:
		// THIS NODE says what that replica is, and how far behind.
		here := slices.ContainsFunc(qs, func(q api.Queue) bool { return q.RaftRole != "" })
		return c.show(raw, func(w *tabwriter.Writer) error {
			head := "NAME\tREADY\tUNACKED\tCONSUMERS\tPUBLISH/S\tDELIVER/S\tACK/S\tLEADER\tREPLICAS"
			if here {
				head += "\tTHIS NODE"
			}
			fmt.Fprintln(w, head)
			for _, q := range qs {
				fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s", q.Name, q.Ready, q.Unacked, q.Consumers,
					fmtVal(q.Rates.Publish), fmtVal(q.Rates.Deliver), fmtVal(q.Rates.Ack), nodeOrDash(q.Leader), nodesOrDash(q.Replicas))
				if here {
					fmt.Fprintf(w, "\t%s", replicaHere(q.QueueStats))
				}
				fmt.Fprintln(w)
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
	if req.IDs != nil && r.Moved == 0 && r.Missing > 0 && r.Missing == len(slices.Compact(slices.Sorted(slices.Values(req.IDs)))) {
		// Some ids missing is a partial replay (counted above); all of
		// them is most likely a wrong queue or ids already replayed.
		return fmt.Errorf("nothing replayed: queue %s holds none of the ids %s (dlq peek %s shows what it holds)", name, *idList, name)
	}
	return nil
}

// replicaHere says what the answering node holds of a replicated queue,
// whose counts it shows: "leader"; "follower"; a follower still applying
// what it knows is committed ("follower, applying N"), or that knows no
// leader yet (just restarted: its counts are its log's, the leader's may
// be ahead); "no replica" (the counts come from elsewhere); "failed: why".
// "-" for a queue every node keeps its own copy of.
func replicaHere(q api.QueueStats) string {
	switch q.RaftRole {
	case "":
		return "-"
	case "none":
		return "no replica"
	case "failed":
		return "failed: " + q.ReplicaError
	case "follower":
		switch {
		case q.RaftCommit > q.RaftApplied:
			return fmt.Sprintf("follower, applying %d", q.RaftCommit-q.RaftApplied)
		case q.Leader == 0:
			return "follower, no leader known"
		}
	}
	return q.RaftRole
}
