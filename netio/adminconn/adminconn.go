// Package adminconn composes netio's Server into the admin API's
// connection layer (admin.Connections): admin imports no netio, so whoever
// runs both (warrend, the tests) wires them with New.
package adminconn

import (
	"github.com/warren-mq/warren/admin"
	"github.com/warren-mq/warren/admin/api"
	"github.com/warren-mq/warren/netio"
)

// New is s as the admin API's connection layer:
// admin.New(s.Broker, adminconn.New(s), log, every).
func New(s *netio.Server) admin.Connections { return conns{s} }

type conns struct{ *netio.Server }

func (c conns) ListConnections() []admin.Connection {
	infos := c.Connections()
	out := make([]admin.Connection, len(infos))
	for i, ci := range infos {
		out[i] = admin.Connection(ci)
	}
	return out
}

func (c conns) ListChannels() []api.Channel {
	infos := c.Channels()
	out := make([]api.Channel, len(infos))
	for i, ci := range infos {
		out[i] = api.Channel{Connection: ci.Connection, Channel: ci.Channel, User: ci.User, Unacked: ci.Unacked,
			Consumers: make([]api.ChannelConsumer, len(ci.Consumers))}
		for j, cc := range ci.Consumers {
			out[i].Consumers[j] = api.ChannelConsumer(cc)
		}
	}
	return out
}

func (c conns) ConnectionStats() admin.ConnectionStats {
	o := c.Overview()
	return admin.ConnectionStats{Version: o.Version, Connections: o.Connections, Channels: o.Channels,
		MemoryHighWatermark: o.MemoryHighWatermark, FlowBlocked: o.FlowBlocked, DiskAlarm: o.DiskAlarm, DiskFreeLimit: o.DiskFreeLimit}
}
