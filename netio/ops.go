package netio

import (
	"crypto/rand"
	"encoding/hex"
	"net"
)

// Overview sums the broker's state.
type Overview struct {
	Version             string `json:"version"`
	Connections         int    `json:"connections"`
	Channels            int64  `json:"channels"`
	Exchanges           int    `json:"exchanges"`
	Queues              int    `json:"queues"`
	Ready               int64  `json:"ready"`
	Unacked             int64  `json:"unacked"`
	Consumers           int64  `json:"consumers"`
	StoredMessageBytes  int64  `json:"stored_message_bytes"`
	MemoryHighWatermark int64  `json:"memory_high_watermark_bytes"`
	FlowBlocked         bool   `json:"flow_blocked"`          // the memory or the disk alarm
	DiskAlarm           bool   `json:"disk_alarm"`            // free disk space below DiskFreeLimit
	DiskFreeLimit       int64  `json:"disk_free_limit_bytes"` // -1: off
	Published           uint64 `json:"published_total"`
	Delivered           uint64 `json:"delivered_total"`
	Acked               uint64 `json:"acked_total"`
}

// Overview returns the broker's totals: the queues' from the broker, the
// connections' from netio.
func (s *Server) Overview() Overview {
	t := s.Totals()
	return Overview{Version: Version, Connections: s.ConnectionCount(), Channels: s.metrics.channels.Load(),
		Exchanges: t.Exchanges, Queues: t.Queues, Ready: t.Ready, Unacked: t.Unacked, Consumers: t.Consumers,
		StoredMessageBytes: s.StoredBytes(), MemoryHighWatermark: s.cfg.MemoryHighWater, FlowBlocked: s.flowBlocked(), DiskAlarm: s.diskAlarm.Load(), DiskFreeLimit: s.cfg.DiskFreeLimit,
		Published: t.Published, Delivered: t.Delivered, Acked: t.Acked}
}

// Authenticate checks a user's password as the protocol does and returns
// the user's tags. remote is the client's address (host:port); guest from
// loopback is an administrator.
func (s *Server) Authenticate(user, pass, remote string) (tags []string, ok bool) {
	loopback := false
	if ip := net.ParseIP(sourceHost(remote)); ip != nil {
		loopback = ip.IsLoopback()
	}
	if !s.auth.check(user, pass, remote, loopback) {
		s.metrics.authFailures.Inc()
		return nil, false
	}
	if u, found := s.auth.user(user); found {
		return u.Tags, true
	}
	return []string{"administrator"}, true // guest (loopback)
}

// AuthRefusal is the reason to give a client whose credentials
// Authenticate refused; remote is its address (host:port).
func (s *Server) AuthRefusal(user, remote string) string {
	ip := net.ParseIP(sourceHost(remote))
	return s.auth.refusal(user, ip != nil && ip.IsLoopback())
}

// SetUsers replaces the configured users (guest and the internal user are
// not among them). Credentials verified for a user before the change are
// checked again.
func (s *Server) SetUsers(users []User) { s.auth.setUsers(users) }

func randomSecret() string {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		panic("netio: no randomness for the internal secret: " + err.Error())
	}
	return hex.EncodeToString(b)
}
