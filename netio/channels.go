package netio

import (
	"cmp"
	"slices"
)

// ChannelInfo is one open channel, as the admin API's channel listing
// shows it.
type ChannelInfo struct {
	Connection uint64 // the connection's id
	Channel    uint16
	User       string
	// Unacked: deliveries handed to the channel's consumers and not yet
	// settled (auto-ack deliveries are not counted).
	Unacked   int
	Consumers []ChannelConsumer
}

// ChannelConsumer is one consumer of a channel.
type ChannelConsumer struct {
	Tag     string
	Queue   string
	AutoAck bool
}

// Channels lists the open channels of every connection, by connection id
// then channel number. It takes each connection's lock in turn, as
// Connections does; its cost is the channels and their unacked deliveries.
func (s *Server) Channels() []ChannelInfo {
	s.connsMu.Lock()
	conns := make([]*conn, 0, len(s.conns))
	for _, c := range s.conns {
		conns = append(conns, c)
	}
	s.connsMu.Unlock()
	var out []ChannelInfo
	for _, c := range conns {
		user := ""
		if c.state.Load() == stOpen {
			user = c.user
		}
		c.mu.Lock()
		for _, ch := range c.channels {
			if ch.closed {
				continue
			}
			info := ChannelInfo{Connection: c.id, Channel: ch.id, User: user}
			for _, t := range ch.tags[ch.head:] {
				if t.state == tagLive {
					info.Unacked++
				}
			}
			for tag, cr := range ch.consumers {
				info.Consumers = append(info.Consumers, ChannelConsumer{Tag: tag, Queue: cr.q.Name(), AutoAck: cr.autoAck})
			}
			slices.SortFunc(info.Consumers, func(a, b ChannelConsumer) int { return cmp.Compare(a.Tag, b.Tag) })
			out = append(out, info)
		}
		c.mu.Unlock()
	}
	slices.SortFunc(out, func(a, b ChannelInfo) int {
		return cmp.Or(cmp.Compare(a.Connection, b.Connection), cmp.Compare(a.Channel, b.Channel))
	})
	return out
}
