// Package kafka is carehub's Kafka layer: client setup with carehub's
// producer defaults and metrics, topic names and creation, readiness and lag
// queries, and an embedded Kafka-protocol broker for single-machine runs.
//
// Everything here speaks the Kafka protocol through franz-go, so the same
// code runs against the embedded broker (franz-go's kfake, persisted under
// the data dir) and against Apache Kafka. The file map:
//
//	topics.go    Topics, DefaultTopics, EnsureTopics
//	client.go    ClientConfig, NewClient (producer defaults, metrics, logging)
//	admin.go     Ping, Lag
//	embedded.go  StartEmbedded, Embedded (kfake with a data dir, crash recovery)
//	lock_*.go    the data dir lock that keeps two processes off one dir
//
// Records are produced through the routes of subpackage publish (Acked, Transactional,
// GroupTxn), the one place that calls the producer; consumers run on subpackage consume.
//
// Tests get brokers from package kafkatest: a fresh kfake cluster per test by
// default, a real broker when CAREHUB_TEST_KAFKA_BROKERS is set.
package kafka
