package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
	"text/tabwriter"
)

// users: warrenctl user … over /api/users (issue 15).
func (c *cli) users(verb string, args []string) error {
	switch verb {
	case "list":
		if err := none("user list", args); err != nil {
			return err
		}
		var raw json.RawMessage
		if err := c.call("GET", "/api/users", nil, &raw); err != nil {
			return err
		}
		var us []struct {
			Name string   `json:"name"`
			Tags []string `json:"tags"`
		}
		_ = json.Unmarshal(raw, &us)
		return c.show(raw, func(w *tabwriter.Writer) error {
			fmt.Fprintln(w, "NAME\tTAGS")
			for _, u := range us {
				tags := strings.Join(u.Tags, ",")
				if tags == "" {
					tags = "-"
				}
				fmt.Fprintf(w, "%s\t%s\n", u.Name, tags)
			}
			return nil
		})
	case "add":
		fs := flags("user add")
		tags := fs.String("tags", "", "comma-separated tags")
		pos, err := parse(fs, args)
		if err != nil {
			return err
		}
		name, err := oneOf("user add", pos)
		if err != nil {
			return err
		}
		pass, err := c.readPassword()
		if err != nil {
			return err
		}
		body := map[string]any{"password": pass, "tags": splitTags(*tags)}
		if err := c.call("PUT", "/api/users/"+url.PathEscape(name), body, nil); err != nil {
			return err
		}
		fmt.Fprintf(c.errw, "user %s added\n", name)
		return nil
	case "set-password":
		name, err := one("user set-password", args)
		if err != nil {
			return err
		}
		pass, err := c.readPassword()
		if err != nil {
			return err
		}
		if err := c.call("PUT", "/api/users/"+url.PathEscape(name), map[string]any{"password": pass}, nil); err != nil {
			return err
		}
		fmt.Fprintf(c.errw, "password of %s changed\n", name)
		return nil
	case "set-tags":
		pos, err := parse(flags("user set-tags"), args)
		if err != nil {
			return err
		}
		if len(pos) < 1 {
			return usageErr{"user set-tags: want a name, then its tags (none clears them)"}
		}
		tags := []string{}
		for _, t := range pos[1:] {
			tags = append(tags, splitTags(t)...)
		}
		if err := c.call("PUT", "/api/users/"+url.PathEscape(pos[0]), map[string]any{"tags": tags}, nil); err != nil {
			return err
		}
		fmt.Fprintf(c.errw, "tags of %s set\n", pos[0])
		return nil
	case "delete":
		name, err := one("user delete", args)
		if err != nil {
			return err
		}
		if err := c.call("DELETE", "/api/users/"+url.PathEscape(name), nil, nil); err != nil {
			return err
		}
		fmt.Fprintf(c.errw, "user %s deleted (its connections closed)\n", name)
		return nil
	}
	return usageErr{"user: want list, add, set-password, set-tags or delete"}
}

// readPassword reads the password: the first line of stdin.
func (c *cli) readPassword() (string, error) {
	line, err := bufio.NewReader(c.stdin).ReadString('\n')
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		if err != nil && !errors.Is(err, io.EOF) {
			return "", err
		}
		return "", errors.New("no password: give it on stdin (one line), e.g. printf '%s\\n' \"$PW\" | warrenctl user add NAME")
	}
	return line, nil
}

func splitTags(s string) []string {
	out := []string{}
	for _, t := range strings.Split(s, ",") {
		if t = strings.TrimSpace(t); t != "" {
			out = append(out, t)
		}
	}
	return out
}

// permissions: warrenctl permission … over /api/permissions (issue 15).
func (c *cli) permissions(verb string, args []string) error {
	switch verb {
	case "list":
		if err := none("permission list", args); err != nil {
			return err
		}
		var raw json.RawMessage
		if err := c.call("GET", "/api/permissions", nil, &raw); err != nil {
			return err
		}
		var ps []map[string]string
		_ = json.Unmarshal(raw, &ps)
		return c.show(raw, func(w *tabwriter.Writer) error {
			fmt.Fprintln(w, "VHOST\tUSER\tCONFIGURE\tWRITE\tREAD")
			for _, p := range ps {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", p["vhost"], p["user"], orEmpty(p["configure"]), orEmpty(p["write"]), orEmpty(p["read"]))
			}
			return nil
		})
	case "set", "clear":
		fs := flags("permission " + verb)
		vhost := fs.String("vhost", "/", "virtual host")
		var conf, write, read *string
		if verb == "set" {
			conf, write, read = fs.String("configure", "", ""), fs.String("write", "", ""), fs.String("read", "", "")
		}
		pos, err := parse(fs, args)
		if err != nil {
			return err
		}
		user, err := oneOf("permission "+verb, pos)
		if err != nil {
			return err
		}
		path := "/api/permissions/" + url.PathEscape(*vhost) + "/" + url.PathEscape(user)
		if *vhost == "/" {
			path = "/api/permissions/%2F/" + url.PathEscape(user)
		}
		if verb == "clear" {
			if err := c.call("DELETE", path, nil, nil); err != nil {
				return err
			}
			fmt.Fprintf(c.errw, "permissions of %s in %s cleared\n", user, *vhost)
			return nil
		}
		if err := c.call("PUT", path, map[string]string{"configure": *conf, "write": *write, "read": *read}, nil); err != nil {
			return err
		}
		fmt.Fprintf(c.errw, "permissions of %s in %s set\n", user, *vhost)
		return nil
	}
	return usageErr{"permission: want list, set or clear"}
}

// orEmpty shows an empty pattern (it matches nothing) as "".
func orEmpty(s string) string {
	if s == "" {
		return `""`
	}
	return s
}
