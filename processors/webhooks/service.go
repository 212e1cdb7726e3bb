// Package webhooks manages webhook subscriptions and delivers events to them, signed per Standard
// Webhooks (DECISIONS §5).
package webhooks

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Subscription is a webhook subscription. Secret is the full secret only on the results of Create
// and RotateSecret; elsewhere it is masked.
type Subscription struct {
	ID              string     `json:"id"`
	OrgID           string     `json:"-"`
	ProjectID       string     `json:"projectId"`
	URL             string     `json:"url"`
	Events          []string   `json:"events"`
	Status          string     `json:"status"` // active, paused, failing, disabled
	Secret          string     `json:"secret"`
	FailureCount    int        `json:"failureCount"`
	LastDeliveredAt *time.Time `json:"lastDeliveredAt"`
	CreatedAt       time.Time  `json:"createdAt"`
	UpdatedAt       time.Time  `json:"updatedAt"`
}

// Delivery is one event's delivery to one subscription.
type Delivery struct {
	ID            string     `json:"id"`
	WebhookID     string     `json:"webhookId"`
	EventID       string     `json:"eventId"`
	EventType     string     `json:"eventType"`
	Status        string     `json:"status"` // pending, delivering, succeeded, failed
	AttemptCount  int        `json:"attemptCount"`
	NextAttemptAt *time.Time `json:"nextAttemptAt"`
	LastAttemptAt *time.Time `json:"lastAttemptAt"`
	CreatedAt     time.Time  `json:"createdAt"`
}

// Attempt is one HTTP attempt of a delivery.
type Attempt struct {
	ID           string    `json:"id"`
	DeliveryID   string    `json:"deliveryId"`
	StatusCode   *int      `json:"statusCode"`
	LatencyMs    int       `json:"latencyMs"`
	Error        *string   `json:"error"`
	ResponseBody *string   `json:"responseBody"`
	AttemptedAt  time.Time `json:"attemptedAt"`
}

// Update changes a subscription; nil fields stay as they are.
type Update struct {
	URL    *string
	Events []string
	Status *string // active, paused, disabled
}

// Service is the webhook subscription service used by the GraphQL and REST transports. Every
// method checks the caller's scope (admin:org) and tenancy from ctx.
type Service struct {
	pool *pgxpool.Pool
}

// NewService returns the service on pool.
func NewService(pool *pgxpool.Pool) *Service { return &Service{pool: pool} }

var errPending = errors.New("webhooks: not implemented yet")

// Create registers a subscription and returns it with its full secret.
func (s *Service) Create(ctx context.Context, projectID, url string, events []string) (*Subscription, error) {
	return nil, errPending
}

// List returns the subscriptions of a project, secrets masked.
func (s *Service) List(ctx context.Context, projectID string) ([]Subscription, error) {
	return nil, errPending
}

// Get returns one subscription, secret masked.
func (s *Service) Get(ctx context.Context, id string) (*Subscription, error) { return nil, errPending }

// Update changes url, events or status (pause, resume, disable).
func (s *Service) Update(ctx context.Context, id string, u Update) (*Subscription, error) {
	return nil, errPending
}

// RotateSecret issues a new secret, returned in full; the old one keeps signing for 24 h.
func (s *Service) RotateSecret(ctx context.Context, id string) (*Subscription, error) {
	return nil, errPending
}

// Delete removes a subscription.
func (s *Service) Delete(ctx context.Context, id string) error { return errPending }

// Deliveries lists a subscription's deliveries, newest first, optionally by status.
func (s *Service) Deliveries(ctx context.Context, webhookID, status string, limit, offset int) ([]Delivery, error) {
	return nil, errPending
}

// Attempts returns the attempts of each delivery, oldest first (a batched loader).
func (s *Service) Attempts(ctx context.Context, deliveryIDs []string) (map[string][]Attempt, error) {
	return nil, errPending
}

// Redeliver schedules a delivery again at once.
func (s *Service) Redeliver(ctx context.Context, deliveryID string) (*Delivery, error) {
	return nil, errPending
}

// Recover schedules again every failed delivery of a subscription created since a time.
func (s *Service) Recover(ctx context.Context, webhookID string, since time.Time) (int, error) {
	return 0, errPending
}

// ByIDs returns subscriptions by id (a batched loader), secrets masked, tenancy applied.
func (s *Service) ByIDs(ctx context.Context, ids []string) (map[string]*Subscription, error) {
	return nil, errPending
}
