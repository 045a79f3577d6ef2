{{/* Chart name, truncated to the 63 characters of a label value. */}}
{{- define "triton-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: the release name, with the chart name unless the release name contains it. */}}
{{- define "triton-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "triton-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Standard app.kubernetes.io labels of every object of the chart. */}}
{{- define "triton-operator.labels" -}}
helm.sh/chart: {{ include "triton-operator.chart" . }}
{{ include "triton-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: triton-operator
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Labels that select the operator pods (immutable across upgrades). */}}
{{- define "triton-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "triton-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "triton-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "triton-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "triton-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The namespaces served, de-duplicated and sorted; empty means the whole cluster. */}}
{{- define "triton-operator.watchNamespaces" -}}
{{- $out := list }}
{{- range .Values.watchNamespaces }}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" .) }}
{{- fail (printf "watchNamespaces: %q is not a namespace name" .) }}
{{- end }}
{{- $out = append $out . }}
{{- end }}
{{- $out | uniq | sortAlpha | toJson }}
{{- end }}

{{/*
What the operator does to the objects it serves, in every namespace it watches. Shared by the
ClusterRole (cluster mode) and the per-namespace Roles (watchNamespaces mode).
*/}}
{{- define "triton-operator.rules" -}}
# The custom resource: kopf watches it; patch/update are for its /status.
- apiGroups: [triton-operator.io]
  resources: [tritonservices]
  verbs: [get, list, watch, patch, update]
# Conditions, revisions, rollout position.
- apiGroups: [triton-operator.io]
  resources: [tritonservices/status]
  verbs: [get, patch, update]
# One Deployment per revision (stable, canary), scaled and pruned by the operator.
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch, update, delete]
# The revision ConfigMaps (configs + pinned manifest) and the Services (<name>, -stable, -canary).
- apiGroups: [""]
  resources: [configmaps, services]
  verbs: [get, list, watch, create, patch, delete]
# The PodDisruptionBudget <name> (node drains evict one serving pod at a time).
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, create, patch, delete]
# The HorizontalPodAutoscaler <name> of spec.autoscaling; list finds a user's or KEDA's HPA on the
# same TritonService, which the operator then leaves alone.
- apiGroups: [autoscaling]
  resources: [horizontalpodautoscalers]
  verbs: [list, create, patch, delete]
# Readiness and crash detection of canary pods; patch only to set the in-place target annotation,
# (spec.rollout.modelUpdates: InPlace) and a pool pod's assignment annotation and model labels
# (spec.pool); never create or delete.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, patch]
# Object-store credentials, read to list and pin the model repository. Never listed or changed.
- apiGroups: [""]
  resources: [secrets]
  verbs: [get]
# kopf posts handler progress and errors as Events (core API); events.k8s.io for the newer API.
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch]
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create, patch]
# What `kubectl triton tune` left past its deadline (a client killed mid-sweep): its perf Jobs,
# listed and deleted (their pods go by cascade); its Deployments, ConfigMaps and Services are above.
- apiGroups: [batch]
  resources: [jobs]
  verbs: [list, delete]
# Gateway API traffic splitting: the operator owns the weights of existing routes.
- apiGroups: [gateway.networking.k8s.io]
  resources: [grpcroutes]
  verbs: [get, list, watch, patch]
# ...and, for spec.pool, the per-model HTTPRoutes <name>-models-<i> it makes and removes.
- apiGroups: [gateway.networking.k8s.io]
  resources: [httproutes]
  verbs: [get, list, watch, create, patch, delete]
{{- end }}

{{/* Labels of the node cache's DaemonSet and pods: its own name and component, so that nothing
selecting the operator's pods (the metrics Service) selects them. */}}
{{- define "triton-operator.nodeCacheSelectorLabels" -}}
app.kubernetes.io/name: {{ include "triton-operator.name" . }}-node-cache
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "triton-operator.nodeCacheLabels" -}}
helm.sh/chart: {{ include "triton-operator.chart" . }}
{{ include "triton-operator.nodeCacheSelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: node-cache
app.kubernetes.io/part-of: triton-operator
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
The Secret holding the node cache's Ed25519 signing key (key `signing-key`): nodeCache.signingKey.existingSecret,
else the one the chart makes (node-cache-key.yaml).
*/}}
{{- define "triton-operator.nodeCacheKeySecret" -}}
{{- default (printf "%s-node-cache-key" (include "triton-operator.fullname" .)) .Values.nodeCache.signingKey.existingSecret }}
{{- end }}
