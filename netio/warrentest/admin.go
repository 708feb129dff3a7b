package warrentest

import (
	"github.com/warren-mq/warren/admin"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/netio/adminconn"
)

// AdminConnections is s as the admin API's connection layer, composed as
// warrend composes them (admin imports no netio):
// admin.New(s.Broker, warrentest.AdminConnections(s), log, every).
func AdminConnections(s *netio.Server) admin.Connections { return adminconn.New(s) }
