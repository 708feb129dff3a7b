package admin

import "github.com/warren-mq/warren/admin/api"

// Connections is what the admin API needs of the connection layer: the
// broker's users (to authenticate and authorize a request) and the open
// connections (to list, count and close them). admin imports no connection
// code (DESIGN §2): netio's Server meets this where warrend composes the
// two (cmd/warrend; netio/warrentest.AdminConnections for tests).
type Connections interface {
	// Authenticate checks a user's password as the protocol does; remote
	// is the client's address (host:port).
	Authenticate(user, pass, remote string) (tags []string, ok bool)
	// AuthRefusal is the reason to give a client whose credentials
	// Authenticate refused.
	AuthRefusal(user, remote string) string
	// AuthorizeOperator is nil if user may make an operator's writes
	// (the administrator tag), or the refusal.
	AuthorizeOperator(user string) error
	// ListConnections lists the open connections.
	ListConnections() []Connection
	// CloseConnection closes a connection with connection_forced,
	// telling it reason; false if there is no such connection.
	CloseConnection(id uint64, reason string) bool
	// ListChannels lists the open channels.
	ListChannels() []api.Channel
	// ConnectionStats is the connection layer's part of the overview.
	ConnectionStats() ConnectionStats
}

// Connection is one open connection, as GET /api/connections lists it.
type Connection = api.Connection

// ConnectionStats is the connection layer's part of GET /api/overview.
type ConnectionStats struct {
	Version             string // the broker's version
	Connections         int
	Channels            int64
	MemoryHighWatermark int64 // bytes; 0: none
	FlowBlocked         bool  // the memory or the disk alarm is on
	DiskAlarm           bool  // free disk space is below DiskFreeLimit
	DiskFreeLimit       int64 // bytes; -1: off
}
