// Package schemas embeds the single source of carehub's wire and storage formats: the GraphQL
// schema, the OpenAPI document, the Postgres and ClickHouse DDL and the JSON Schemas of the Kafka
// messages. Code reads them from here so a binary always carries the formats it was built with.
package schemas

import "embed"

// Postgres holds the ordered migrations, postgres/NNNN_name.sql, applied in lexical order.
//
//go:embed postgres/*.sql
var Postgres embed.FS

// GraphQL is the GraphQL schema (SDL), schema version 2.0. Parse it with
// graphql.UseStringDescriptions() so its descriptions reach introspection.
//
//go:embed graphql/schema.graphql
var GraphQL string

// OpenAPI holds the OpenAPI 3.1 description of the REST interface, openapi/openapi.json, served
// at GET /v1/openapi.json.
//
//go:embed openapi/*.json
var OpenAPI embed.FS

// ClickHouse holds the ClickHouse DDL of the event and audit logs, clickhouse/NNNN_name.sql,
// applied in lexical order by storage/clickhouse.Open (every statement is idempotent).
//
//go:embed clickhouse/*.sql
var ClickHouse embed.FS

// Kafka holds the JSON Schemas of the topics' messages (kafka/<topic>.v1.json) and the event
// type catalogue generated from kernel/events.Catalogue (kafka/event-types.json).
//
//go:embed kafka/*.json
var Kafka embed.FS
