package warrentest

import (
	"github.com/warren-mq/warren/admin"
	"github.com/warren-mq/warren/admin/api"
	"github.com/warren-mq/warren/netio"
)

// AdminConnections is s as the admin API's connection layer, composed as
// warrend composes them (admin imports no netio):
// admin.New(s.Broker, warrentest.AdminConnections(s), log, every).
func AdminConnections(s *netio.Server) admin.Connections { return adminConns{s} }

type adminConns struct{ *netio.Server }

func (c adminConns) ListConnections() []admin.Connection {
	infos := c.Connections()
	out := make([]admin.Connection, len(infos))
	for i, ci := range infos {
		out[i] = admin.Connection(ci)
	}
	return out
}

func (c adminConns) ListChannels() []api.Channel {
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

func (c adminConns) ConnectionStats() admin.ConnectionStats {
	o := c.Overview()
	return admin.ConnectionStats{Version: o.Version, Connections: o.Connections, Channels: o.Channels,
		MemoryHighWatermark: o.MemoryHighWatermark, FlowBlocked: o.FlowBlocked}
}
