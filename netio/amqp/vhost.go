package amqp

import (
	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/wire"
)

// Virtual hosts (issue 15): connection.open's virtual-host is opened
// through netio's OpenVhost (the vhost exists, the user has permissions
// there, it is under its max_connections); every name a client gives is
// qualified with the vhost (broker.QualifyName), every name it is answered
// stripped (broker.LocalName; refusals in errOf). A deleted vhost's
// connections and a deleted user's are closed (followDeletes).

// vh is the connection's vhost ("/" until it opened one).
func (c *conn) vh() string {
	if c.vhost == "" {
		return broker.DefaultVhost
	}
	return c.vhost
}

// qn is the internal name of a name the client gives.
func (c *conn) qn(name string) string { return broker.QualifyName(c.vhost, name) }

// pubExchange is the internal name of a publish's exchange, the last one
// kept, so a run of publishes to one exchange allocates nothing.
func (c *conn) pubExchange(local string) string {
	if c.vhost == "" || c.vhost == broker.DefaultVhost {
		return broker.QualifyName("", local)
	}
	if local != c.exLocal || c.exQual == "" {
		c.exLocal, c.exQual = local, c.qn(local)
	}
	return c.exQual
}

// followDeletes closes this listener's connections of a user or a vhost
// deleted at run time (with connection-forced, 320, as RabbitMQ does).
func (l *Listener) followDeletes() {
	l.srv.OnUserDeleted(func(user string) {
		l.closeWhere(func(c *conn) bool { return c.opened.Load() && c.user == user }, "CONNECTION_FORCED - user '"+user+"' was deleted")
	})
	l.srv.OnVhostDeleted(func(vhost string) {
		l.closeWhere(func(c *conn) bool { return c.opened.Load() && c.vh() == vhost }, "CONNECTION_FORCED - vhost '"+vhost+"' was deleted")
	})
}

func (l *Listener) closeWhere(match func(*conn) bool, text string) {
	l.mu.Lock()
	var cs []*conn
	for c := range l.conns {
		if match(c) {
			cs = append(cs, c)
		}
	}
	l.mu.Unlock()
	for _, c := range cs {
		c.forceClose(connectionForced, text)
	}
}

// setVhost records the vhost a connection opened (counted by OpenVhost
// until forgetLocked), unless it is gone already: then it is uncounted
// now, and false.
func (l *Listener) setVhost(c *conn, vhost string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.conns[c]; !ok {
		l.srv.CloseVhost(vhost)
		return false
	}
	c.vhost = vhost
	return true
}

// errText is an error's reason (a *wire.Error's, without its code).
func errText(err error) string {
	if we, ok := err.(*wire.Error); ok {
		return we.Reason
	}
	return err.Error()
}
