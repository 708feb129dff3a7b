package broker

import (
	"cmp"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

// Virtual hosts (issue 15) are namespaces of exchanges, queues and
// bindings. The design: one metadata state machine, one routing table and
// one set of shards for every vhost, with the vhost in the name. The
// default vhost "/" keeps plain names, so the durable data of a broker
// from before vhosts stays valid as it is; any other vhost's resources are
// named internally "vhost" VhostSep "name", VhostSep a control character
// no client-given name may hold (validName), so no two vhosts' names can
// meet. The fronts (netio, netio/amqp, admin) qualify every name a client
// gives with its connection's vhost (QualifyName) and strip it from every
// name they answer with (LocalName): a client never sees nor names
// another vhost's resources. Inside, what follows a name follows the
// vhost: a vhost's default exchange is "vhost" VhostSep (queue.Table
// routes it to the vhost's queue named by the key), alternate exchanges
// are stored qualified, and a queue's dead-letter exchange is resolved in
// the vhost of the queue.

// DefaultVhost is the virtual host a client gets when it names none.
const DefaultVhost = "/"

// VhostSep separates the vhost from the name in an internal name.
const VhostSep = queue.VhostSep

// MaxVhostName bounds a vhost's name (bytes): a qualified name is at
// most 255 bytes, like every name, so the resource names of a vhost are
// at most 254 - len(vhost) bytes.
const MaxVhostName = 64

// QualifyName is the internal name of name in vhost ("" or "/": name).
// A name that holds VhostSep (no valid name does, but a client may send
// one to look up or delete) gets a name in no vhost, which nothing can
// have: it never reaches another vhost's resource.
func QualifyName(vhost, name string) string {
	if strings.IndexByte(name, VhostSep) >= 0 {
		return string(rune(VhostSep)) + name
	}
	if vhost == "" || vhost == DefaultVhost {
		return name
	}
	return vhost + string(rune(VhostSep)) + name
}

// SplitName is the vhost and the client's name of an internal name.
func SplitName(internal string) (vhost, name string) {
	if i := strings.IndexByte(internal, VhostSep); i >= 0 {
		return internal[:i], internal[i+1:]
	}
	return DefaultVhost, internal
}

// LocalName is the name a client of the internal name's vhost knows it by.
func LocalName(internal string) string {
	_, n := SplitName(internal)
	return n
}

// QueueText names the queue of an internal name for an operator (an
// error logged or answered to the admin API): queue "q" in vhost "/". The
// one form; a client's own refusals name its queue without the vhost
// (LocalName), log lines with queueLog.
func QueueText(internal string) string {
	v, n := SplitName(internal)
	return "queue " + strconv.Quote(n) + " in vhost " + strconv.Quote(v)
}

// queueLog is the attributes naming the queue of an internal name in a
// log line: vhost=/ queue=q (an empty group's attributes are inlined).
func queueLog(internal string) slog.Attr {
	v, n := SplitName(internal)
	return slog.Group("", slog.String("vhost", v), slog.String("queue", n))
}

// queueList names the queues of internal names (their order is not kept)
// as QueueText does, each vhost once, its queues by name: queues "a",
// "b" in vhost "/"; queue "c" in vhost "v". At most limit are named, and
// how many more there are said.
func queueList(internal []string, limit int) string {
	type vn struct{ v, n string }
	all := make([]vn, len(internal))
	for i, name := range internal {
		all[i].v, all[i].n = SplitName(name)
	}
	slices.SortFunc(all, func(a, b vn) int { return cmp.Or(cmp.Compare(a.v, b.v), cmp.Compare(a.n, b.n)) })
	shown := all[:min(len(all), limit)]
	var b strings.Builder
	for i := 0; i < len(shown); {
		j := i + 1
		for j < len(shown) && shown[j].v == shown[i].v {
			j++
		}
		if i > 0 {
			b.WriteString("; ")
		}
		if j-i == 1 {
			b.WriteString("queue ")
		} else {
			b.WriteString("queues ")
		}
		for k := i; k < j; k++ {
			if k > i {
				b.WriteString(", ")
			}
			b.WriteString(strconv.Quote(shown[k].n))
		}
		b.WriteString(" in vhost " + strconv.Quote(shown[i].v))
		i = j
	}
	if len(all) > limit {
		fmt.Fprintf(&b, " and %d more", len(all)-limit)
	}
	return b.String()
}

// VhostOf is the vhost of an internal name.
func VhostOf(internal string) string {
	v, _ := SplitName(internal)
	return v
}

// InVhost reports whether the internal name belongs to vhost.
func InVhost(internal, vhost string) bool { return VhostOf(internal) == vhost }

// LocalText strips the vhost part of the internal names quoted (as
// strconv.Quote writes them) in a message, for a client of that vhost:
// refusals built from internal names name the client's own resources.
func LocalText(s string) string {
	const esc = `\x1f`
	for {
		i := strings.Index(s, esc)
		if i < 0 {
			return s
		}
		j := strings.LastIndexByte(s[:i], '"')
		s = s[:j+1] + s[i+len(esc):]
	}
}

// checkVhostName: 1 to MaxVhostName bytes of printable UTF-8.
func checkVhostName(name string) error {
	if name == "" || len(name) > MaxVhostName {
		return reqErr(wire.InvalidArgument, "a virtual host name is 1 to %d bytes", MaxVhostName)
	}
	return validName(name)
}

// checkLocalName checks the client's part of an internal name: validName,
// and short enough to leave room for its vhost.
func checkLocalName(internal string) error {
	v, n := SplitName(internal)
	if err := validName(n); err != nil {
		return err
	}
	if v != DefaultVhost && len(internal) > wire.MaxNameLen {
		return reqErr(wire.InvalidArgument, "name %s longer than %d bytes: in virtual host %s names are at most 254 bytes less the vhost's name",
			strconv.Quote(n), wire.MaxNameLen-len(v)-1, strconv.Quote(v))
	}
	return nil
}
