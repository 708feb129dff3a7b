package netio

// What another protocol front (netio/amqp) uses of the server beside the
// broker core it embeds: the same connection ids, users, limits and memory
// alarm as the native protocol.

// NewConnID gives out a connection id from the native connections'
// sequence: owners of exclusive queues and consumers (broker Down) are
// unique across fronts.
func (s *Server) NewConnID() uint64 { return s.connSeq.Add(1) }

// MemoryAlarm reports whether publishers must wait (the memory alarm is
// on, or the stored bytes are over the high-watermark).
func (s *Server) MemoryAlarm() bool { return s.memoryAlarm() }

// MaxPrefetch is the cap on a consumer's unacked deliveries.
func (s *Server) MaxPrefetch() uint32 { return s.cfg.MaxPrefetch }

// MaxOutboundBytes is the per-connection outbox cap.
func (s *Server) MaxOutboundBytes() int { return s.cfg.MaxOutboundBytes }

// IsAdmin reports whether user has the administrator tag (or is guest).
func (s *Server) IsAdmin(user string) bool { return s.isAdmin(user) }
