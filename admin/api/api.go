// Package api holds the admin HTTP API's request and response bodies as
// plain Go types: the server (admin) writes them and warrenctl reads
// them, so the two cannot disagree on a JSON name. spec/admin-api.yaml
// describes the same bodies for other clients.
//
// A queue's arguments (QueueArgs) are not written here by hand: each field
// is one of wire.QueueArgDescs, found by its JSON name, and a test checks
// that the struct, the descriptors and spec/admin-api.yaml agree.
package api

import "github.com/warren-mq/warren/wire"

// ErrorBody is every error reply: the protocol's error code and name, and
// a message.
type ErrorBody struct {
	Error struct {
		Code    int    `json:"code"`
		Name    string `json:"name"`
		Message string `json:"message"`
	} `json:"error"`
}

// QueueSettings is the body of PUT /api/queues/{name}, and the settings
// part of a Queue: the flags and the protocol arguments, absent meaning
// unset.
type QueueSettings struct {
	Durable    bool `json:"durable"`
	AutoDelete bool `json:"auto_delete"`
	QueueArgs
}

// QueueStats are a queue's counts.
type QueueStats struct {
	Name              string `json:"name"`
	Ready             int64  `json:"ready"`
	Unacked           int64  `json:"unacked"`
	Consumers         int64  `json:"consumers"`
	Published         uint64 `json:"published_total"`
	Delivered         uint64 `json:"delivered_total"`
	Acked             uint64 `json:"acked_total"`
	Redelivered       uint64 `json:"redelivered_total"`
	DeadLettered      uint64 `json:"dead_lettered_total"`
	DeadLetterDropped uint64 `json:"dead_letter_dropped_total"`
	DeadLettersHeld   int64  `json:"dead_letters_held"` // durable queues: dead letters kept until their targets have them
	// Leader is the node leading a durable queue (as this node knows it;
	// 0: none known) and Replicas the nodes holding it; both absent for
	// a queue every node keeps its own copy of (non-durable, exclusive).
	// ("replicas" is the declared count, QueueArgs.Replicas.)
	Leader   uint64   `json:"leader,omitempty"`
	Replicas []uint64 `json:"replica_nodes,omitempty"`
	// RaftRole is the answering node's part in the queue's raft group
	// ("leader", "follower", "none": no replica there, "failed": its
	// replica there did not open, ReplicaError says why); RaftCommit and
	// RaftApplied its commit index and applied index (the difference is
	// its commit lag). Replicated queues in a cluster only.
	RaftRole     string `json:"raft_role,omitempty"`
	RaftCommit   uint64 `json:"raft_commit_index,omitempty"`
	RaftApplied  uint64 `json:"raft_applied_index,omitempty"`
	ReplicaError string `json:"replica_error,omitempty"`
	// RaftVoters: the voters of the queue's raft group as the answering
	// node applied them last (a replica being rebuilt or moved there is
	// none until promoted, caught up).
	RaftVoters []uint64 `json:"raft_voters,omitempty"`
}

// Rates are per-second rates over the last sampling interval.
type Rates struct {
	Publish    float64 `json:"publish"`
	Deliver    float64 `json:"deliver"`
	Ack        float64 `json:"ack"`
	Redeliver  float64 `json:"redeliver"`
	DeadLetter float64 `json:"dead_letter"`
}

// Queue is one queue as GET /api/queues and GET /api/queues/{name} show
// it (and PUT /api/queues/{name} answers): counts, settings and rates.
type Queue struct {
	QueueStats
	Exclusive bool `json:"exclusive"`
	QueueSettings
	Rates Rates `json:"rates"`
}

// ExchangeSettings is the body of PUT /api/exchanges/{name}.
type ExchangeSettings struct {
	Type       string         `json:"type"`
	Durable    bool           `json:"durable"`
	AutoDelete bool           `json:"auto_delete"`
	Internal   bool           `json:"internal"`
	Alternate  string         `json:"alternate_exchange"`
	Arguments  map[string]any `json:"arguments"`
}

// Exchange is one exchange as GET /api/exchanges and GET
// /api/exchanges/{name} show it.
type Exchange struct {
	Name       string     `json:"name"`
	Type       string     `json:"type"`
	Durable    bool       `json:"durable"`
	AutoDelete bool       `json:"auto_delete"`
	Internal   bool       `json:"internal"`
	Alternate  string     `json:"alternate_exchange,omitempty"`
	Args       wire.Table `json:"arguments,omitempty"`
}

// Binding is the body of PUT and DELETE /api/bindings and one binding of
// GET /api/bindings: exactly one of Queue and DestinationExchange is set.
type Binding struct {
	Exchange            string         `json:"exchange"`
	Queue               string         `json:"queue,omitempty"`
	DestinationExchange string         `json:"destination_exchange,omitempty"`
	RoutingKey          string         `json:"routing_key"`
	Arguments           map[string]any `json:"arguments,omitempty"`
}

// CountRequest is the body of POST /api/queues/{name}/get (Count only)
// and /replay.
type CountRequest struct {
	Count int     `json:"count"`
	Rate  float64 `json:"rate,omitempty"` // replay only: msgs/s, 0 = unlimited
	// IDs (replay only, instead of Count): the messages to replay, by the
	// ids /get shows.
	IDs []uint64 `json:"ids,omitempty"`
}

// Deleted answers DELETE /api/queues/{name}.
type Deleted struct {
	Messages int64 `json:"deleted_messages"`
}

// Purged answers POST /api/queues/{name}/purge.
type Purged struct {
	Messages int64 `json:"purged"`
}

// ReplayResult says what a replay did.
type ReplayResult struct {
	Moved   int    `json:"moved"`
	Skipped int    `json:"skipped"` // messages with no death history, left in the queue
	Missing int    `json:"missing"` // ids (a replay of chosen messages) the queue no longer held
	Error   string `json:"error,omitempty"`
}

// Message is one message as POST /api/queues/{name}/get shows it.
type Message struct {
	// ID names the message in its queue while the broker runs: a replay
	// of chosen messages takes it.
	ID            uint64      `json:"id"`
	Exchange      string      `json:"exchange"`
	RoutingKey    string      `json:"routing_key"`
	Priority      uint8       `json:"priority"`
	Persistent    bool        `json:"persistent"`
	DeliveryCount uint32      `json:"delivery_count"`
	FailedCount   uint32      `json:"failed_count"`
	Properties    *wire.Props `json:"properties,omitempty"`
	Body          []byte      `json:"body"`
}

// Messages answers POST /api/queues/{name}/get.
type Messages struct {
	Messages []Message `json:"messages"`
}

// Overview is GET /api/overview: the broker's totals, the queues' from the
// broker and the connections' from the connection layer.
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
	FlowBlocked         bool   `json:"flow_blocked"`
	Published           uint64 `json:"published_total"`
	Delivered           uint64 `json:"delivered_total"`
	Acked               uint64 `json:"acked_total"`
	// Redelivered and DeadLettered sum the live queues' counters (a
	// deleted queue's are gone with it).
	Redelivered  uint64 `json:"redelivered_total"`
	DeadLettered uint64 `json:"dead_lettered_total"`
	// DiskFree and DiskTotal are the data directory's file system's space
	// available to the broker and its size (absent: unknown).
	DiskFree  uint64 `json:"disk_free_bytes,omitempty"`
	DiskTotal uint64 `json:"disk_total_bytes,omitempty"`
	// DiskAlarm is on while the free space is below DiskFreeLimit
	// (--disk-free-limit; -1: off): publishers are blocked (FlowBlocked).
	DiskAlarm     bool  `json:"disk_alarm"`
	DiskFreeLimit int64 `json:"disk_free_limit_bytes"`
	// Rates are the whole broker's over the last sampling interval.
	Rates Rates `json:"rates"`
}

// Connection is one open connection as GET /api/connections lists it.
type Connection struct {
	ID       uint64 `json:"id"`
	Remote   string `json:"remote"`
	User     string `json:"user"`
	Channels int    `json:"channels"`
	// Blocked: the broker has stopped reading this connection because it
	// published while the memory alarm was on.
	Blocked bool `json:"blocked"`
	// OutboundBytes: what the broker holds for the connection that the
	// socket has not taken.
	OutboundBytes int64 `json:"outbound_bytes"`
	// AutoAcksHeld: auto-ack deliveries written but not yet settled,
	// because the connection's buffered output is over its bound.
	AutoAcksHeld int `json:"auto_acks_held"`
	// TLS: the connection came through the TLS listener.
	TLS bool `json:"tls"`
	// Vhost: the virtual host it opened.
	Vhost string `json:"vhost,omitempty"`
}

// QueuePage is GET /api/queues with page or page_size: one page of the
// queues that match the filter, in the order asked for.
type QueuePage struct {
	Items         []Queue `json:"items"`
	Page          int     `json:"page"`
	PageSize      int     `json:"page_size"`
	PageCount     int     `json:"page_count"`     // pages of the filtered queues (at least 1)
	FilteredCount int     `json:"filtered_count"` // queues that match the filter
	TotalCount    int     `json:"total_count"`    // queues in all
}

// Channel is one open channel as GET /api/channels lists it.
type Channel struct {
	Connection uint64 `json:"connection"`
	Channel    uint16 `json:"channel"`
	User       string `json:"user"`
	// Unacked: deliveries handed to the channel's consumers, not yet
	// settled (auto-ack deliveries are not counted).
	Unacked   int               `json:"unacked"`
	Consumers []ChannelConsumer `json:"consumers"`
}

// ChannelConsumer is one consumer on a channel.
type ChannelConsumer struct {
	Tag     string `json:"tag"`
	Queue   string `json:"queue"`
	AutoAck bool   `json:"auto_ack"`
}

// PublishRequest is the body of POST /api/exchanges/{name}/publish
// (amq.default names the default exchange).
type PublishRequest struct {
	RoutingKey string `json:"routing_key"`
	Payload    string `json:"payload"`
	// PayloadEncoding: "string" (the default: the payload's UTF-8 bytes)
	// or "base64".
	PayloadEncoding string      `json:"payload_encoding,omitempty"`
	Priority        uint8       `json:"priority,omitempty"`
	Properties      *wire.Props `json:"properties,omitempty"`
}

// PublishResult answers POST /api/exchanges/{name}/publish.
type PublishResult struct {
	Routed bool `json:"routed"` // some queue took the message
	Queues int  `json:"queues"` // how many queues took it
}

// UserSettings is the body of PUT /api/users/{name}: a password (hashed
// with bcrypt by the broker, never kept) or a bcrypt password_hash made
// elsewhere (warrend hash-password), and the tags ("administrator").
type UserSettings struct {
	Password     *string  `json:"password,omitempty"`
	PasswordHash string   `json:"password_hash,omitempty"`
	Tags         []string `json:"tags"`
}

// User is a user as GET /api/users shows it: no password, no hash.
type User struct {
	Name string   `json:"name"`
	Tags []string `json:"tags"`
}

// VhostSettings is the body of PUT /api/vhosts/{name}: the vhost's
// limits (0: none beyond the broker's).
type VhostSettings struct {
	MaxQueues      int64 `json:"max_queues,omitempty"`
	MaxConnections int64 `json:"max_connections,omitempty"`
}

// Vhost is one virtual host, as GET /api/vhosts lists it: its limits and
// what it holds.
type Vhost struct {
	Name string `json:"name"`
	VhostSettings
	Queues      int `json:"queues"`
	Connections int `json:"connections"`
}

// Permission is a user's permissions in a vhost (PUT
// /api/permissions/{vhost}/{user} takes configure, write and read):
// RabbitMQ's regular expressions over resource names; "" matches nothing.
type Permission struct {
	Vhost     string `json:"vhost,omitempty"`
	User      string `json:"user,omitempty"`
	Configure string `json:"configure"`
	Write     string `json:"write"`
	Read      string `json:"read"`
}
