// Package schemas embeds the single source of carehub's wire and storage formats: the GraphQL
// schema, the OpenAPI document, the Postgres and ClickHouse DDL and the JSON Schemas of the Kafka
// messages. Code reads them from here so a binary always carries the formats it was built with.
package schemas

import "embed"

// Postgres holds the ordered migrations, postgres/NNNN_name.sql, applied in lexical order.
//
//go:embed postgres/*.sql
var Postgres embed.FS
