"""Tenancy: the tenant index, quotas, ratios, forget, and the per-tenant ACL users."""
