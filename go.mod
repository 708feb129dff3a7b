module github.com/warren-mq/warren

go 1.26.8

require (
	github.com/cespare/xxhash/v2 v2.3.0
	github.com/cockroachdb/datadriven v1.0.3
	github.com/klauspost/compress v1.20.4
)

require github.com/pmezard/go-difflib v1.0.0 // indirect
