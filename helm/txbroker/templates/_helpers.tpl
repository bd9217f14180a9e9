{{/* Common names and labels. */}}

{{- define "txbroker.fullname" -}}
{{- printf "%s-txbroker-operator" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "txbroker.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "txbroker.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "txbroker.selectorLabels" -}}
app.kubernetes.io/name: txbroker-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "txbroker.labels" -}}
{{ include "txbroker.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: txbroker
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The rules the operator needs, shared by the ClusterRole and the per-namespace Roles. */}}
{{- define "txbroker.rules" -}}
# TxBrokers: Kopf watches them and keeps its progress in their annotations (patch);
# the operator writes their status.
- apiGroups: [txbroker.dev]
  resources: [txbrokers]
  verbs: [get, list, watch, patch]
- apiGroups: [txbroker.dev]
  resources: [txbrokers/status]
  verbs: [get, patch]
# ownerReferences with blockOwnerDeletion on pods and services it creates
- apiGroups: [txbroker.dev]
  resources: [txbrokers/finalizers]
  verbs: [update]
# broker pods: created, watched (readiness, IPs), deleted on scale-down
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, create, delete]
# the headless and <name>-master Services, one PVC per broker when spec.storage is set: create-if-absent
- apiGroups: [""]
  resources: [services, persistentvolumeclaims]
  verbs: [create]
# Kopf posts warnings and errors as Events
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create]
{{- end -}}
