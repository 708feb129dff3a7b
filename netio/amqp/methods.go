package amqp

import (
	"strconv"

	"github.com/warren-mq/warren/wire"
)

var errSyntax = connErr(syntaxError, "SYNTAX_ERROR - malformed method arguments")

// errDefaultExchange refuses to bind to, from or delete the default
// exchange, in RabbitMQ's words.
var errDefaultExchange = chErr(accessRefused, "ACCESS_REFUSED - operation not permitted on the default exchange")

// onMethod handles a method on an open channel.
func (c *conn) onMethod(ch *channel, class, id uint16, r *reader) error {
	switch class {
	case classChannel:
		switch id {
		case 20: // flow
			active := r.bitAt()
			if r.err != nil {
				return errSyntax
			}
			if !active {
				return connErr(notImplemented, "NOT_IMPLEMENTED - active=false")
			}
			c.reply(ch.id, classChannel, 21, func(b []byte) []byte { return append(b, 1) })
			return nil
		case 40: // close
			c.mu.Lock()
			r, ok := c.releaseLocked(ch)
			if ok {
				delete(c.channels, ch.id)
			}
			// else a shard closed the channel since the frame was read
			// (a consume refused): the close crossed the broker's, and
			// the channel is freed at the client's close-ok (handle).
			c.mu.Unlock()
			c.dropReply(r.reply)
			c.submitRelease(r)
			c.reply(ch.id, classChannel, 41, nil)
			return nil
		case 41: // close-ok without a close
			return nil
		}
	case classExchange:
		return c.onExchange(ch, id, r)
	case classQueue:
		return c.onQueue(ch, id, r)
	case classBasic:
		return c.onBasic(ch, id, r)
	case classConfirm:
		if id == 10 {
			noWait := r.bitAt()
			if r.err != nil {
				return errSyntax
			}
			if ch.tx {
				return chErr(preconditionFailed, "PRECONDITION_FAILED - cannot switch from tx to confirm mode")
			}
			ch.confirm = true
			if !noWait {
				c.reply(ch.id, classConfirm, 11, nil)
			}
			return nil
		}
	case classTx:
		return c.onTx(ch, id)
	}
	return connErr(commandInvalid, "COMMAND_INVALID - unknown method "+strconv.Itoa(int(class))+"."+strconv.Itoa(int(id)))
}

func isCode(err error, code wire.Code) bool {
	we, ok := err.(*wire.Error)
	return ok && we.Code == code
}
