package main

import (
	"encoding/json"
	"fmt"
	"net/url"
	"text/tabwriter"
)

// vhostUsage is warrenctl vhost's line in the help.
const vhostUsage = `  vhost list | add NAME [--max-queues N] [--max-connections N] | set-limits NAME [same flags] | delete NAME
      A virtual host is a namespace of exchanges, queues and bindings ("/" always exists); a user opens
      one only with permissions there (permission set USER --vhost NAME). Deleting one deletes
      everything in it and closes its connections. A limit of 0 is none.
`

// vhosts is warrenctl vhost, over /api/vhosts.
func (c *cli) vhosts(verb string, args []string) error {
	switch verb {
	case "list":
		if err := none("vhost list", args); err != nil {
			return err
		}
		var raw json.RawMessage
		if err := c.call("GET", "/api/vhosts", nil, &raw); err != nil {
			return err
		}
		var vs []struct {
			Name           string `json:"name"`
			MaxQueues      int64  `json:"max_queues"`
			MaxConnections int64  `json:"max_connections"`
			Queues         int    `json:"queues"`
			Connections    int    `json:"connections"`
		}
		_ = json.Unmarshal(raw, &vs)
		return c.show(raw, func(w *tabwriter.Writer) error {
			fmt.Fprintln(w, "NAME\tQUEUES\tMAX_QUEUES\tCONNECTIONS\tMAX_CONNECTIONS")
			for _, v := range vs {
				fmt.Fprintf(w, "%s\t%d\t%s\t%d\t%s\n", v.Name, v.Queues, limitText(v.MaxQueues), v.Connections, limitText(v.MaxConnections))
			}
			return nil
		})
	case "add", "set-limits":
		fs := flags("vhost " + verb)
		maxQ := fs.Int64("max-queues", 0, "")
		maxC := fs.Int64("max-connections", 0, "")
		pos, err := parse(fs, args)
		if err != nil {
			return err
		}
		name, err := oneOf("vhost "+verb, pos)
		if err != nil {
			return err
		}
		if verb == "set-limits" {
			if err := c.call("GET", vhostPath(name), nil, nil); err != nil {
				return err // set-limits does not create one
			}
		}
		body := map[string]int64{"max_queues": *maxQ, "max_connections": *maxC}
		if err := c.call("PUT", vhostPath(name), body, nil); err != nil {
			return err
		}
		fmt.Fprintf(c.errw, "virtual host %s %s\n", name, map[string]string{"add": "added", "set-limits": "limits set"}[verb])
		return nil
	case "delete":
		pos, err := parse(flags("vhost delete"), args)
		if err != nil {
			return err
		}
		name, err := oneOf("vhost delete", pos)
		if err != nil {
			return err
		}
		if err := c.call("DELETE", vhostPath(name), nil, nil); err != nil {
			return err
		}
		fmt.Fprintf(c.errw, "virtual host %s deleted, with everything in it\n", name)
		return nil
	}
	return usageErr{"vhost: want list, add, set-limits or delete"}
}

// vhostPath is a vhost's path in the admin API ("/" is %2F).
func vhostPath(name string) string { return "/api/vhosts/" + url.PathEscape(name) }

func limitText(n int64) string {
	if n <= 0 {
		return "-"
	}
	return fmt.Sprint(n)
}
