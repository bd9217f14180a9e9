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
# TxBrokers and TxProducerGroups: Kopf watches them and keeps its progress in their annotations
# (patch); the operator writes their status.
- apiGroups: [txbroker.dev]
  resources: [txbrokers, txproducergroups]
  verbs: [get, list, watch, patch]
- apiGroups: [txbroker.dev]
  resources: [txbrokers/status, txproducergroups/status]
  verbs: [get, patch]
# ownerReferences with blockOwnerDeletion on what it creates for a TxBroker
- apiGroups: [txbroker.dev]
  resources: [txbrokers/finalizers]
  verbs: [update]
# broker pods: created, watched (readiness, IPs), relabelled on failover (patch), deleted on
# scale-down and rolling updates
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, create, patch, delete]
# the broker config file and the cluster route (<name>-config, <name>-route): created, kept in line
# with the spec
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, create, patch]
# the headless and <name>-master Services and the brokers' ServiceAccount: created, read and put
# back when edited (drift repair: an edited <name>-master selector would send clients elsewhere)
- apiGroups: [""]
  resources: [services, serviceaccounts]
  verbs: [get, create, patch]
# one PVC per broker when spec.storage is set: create-if-absent (never changed: they outlive the
# TxBroker); a removed broker group's claims are listed and deleted, only once the group is drained
# (nothing undelivered) or its removal forced
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [create, list, delete]
# the PodDisruptionBudget: created, put back when edited, removed when replicas drops to 1
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, create, patch, delete]
# a TxBroker's NetworkPolicy when spec.networkPolicy.enabled: kept in line, removed when disabled
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, create, patch, delete]
# the Secrets a TxBroker names (spec.authSecretRef, spec.tls.secretRef): read for the operator's own
# admin-API credentials and CA, never written
- apiGroups: [""]
  resources: [secrets]
  verbs: [get]
# Events on TxBrokers and TxProducerGroups (failover, rolling update, applied settings; Kopf's errors)
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create]
{{- end -}}

{{/* ---- spark-*: the Spark job (spark.*) and what it needs ---- */}}

{{- define "txbroker.spark.name" -}}
{{- default (printf "%s-spark" .Release.Name) .Values.spark.name | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{/* This run's name: the SparkApplication, the spark-submit Job (+ "-submit") and Spark's app name. */}}
{{- define "txbroker.spark.runName" -}}
{{- printf "%s-%s" (include "txbroker.spark.name" .) (toString .Values.spark.runId) -}}
{{- end -}}

{{/* sparkApplication or sparkSubmit: spark.mode, with auto resolved against the cluster's APIs. */}}
{{- define "txbroker.spark.mode" -}}
{{- $has := .Capabilities.APIVersions.Has "sparkoperator.k8s.io/v1beta2/SparkApplication" -}}
{{- if eq .Values.spark.mode "sparkSubmit" -}}
sparkSubmit
{{- else if $has -}}
sparkApplication
{{- else if eq .Values.spark.mode "sparkApplication" -}}
{{- fail "spark.mode=sparkApplication needs the SparkApplication API (sparkoperator.k8s.io/v1beta2), which this cluster does not serve: install the Spark operator first, or set spark.mode=sparkSubmit (or auto). With helm template: --api-versions sparkoperator.k8s.io/v1beta2/SparkApplication" -}}
{{- else -}}
sparkSubmit
{{- end -}}
{{- end -}}

{{- define "txbroker.spark.serviceAccountName" -}}
{{- if .Values.spark.serviceAccount.create -}}
{{- default (include "txbroker.spark.name" .) .Values.spark.serviceAccount.name -}}
{{- else -}}
{{- required "spark.serviceAccount.name is required when spark.serviceAccount.create is false" .Values.spark.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "txbroker.spark.image" -}}
{{- printf "%s:%s" .Values.spark.image.repository (.Values.spark.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* The TxBroker the job publishes to: spark.broker.name, else the chart's TxBroker's name. */}}
{{- define "txbroker.spark.brokerName" -}}
{{- .Values.spark.broker.name | default .Values.txbroker.name | default .Release.Name -}}
{{- end -}}

{{/* HOST:PORT[,...]: spark.broker.address, else the TxBroker's <name>-master Service, which selects
     every broker group's master (it follows failover): the data source learns the route of all the
     groups from whichever answers (tests/e2e/test_k8s_spark_groups.py checks this render). */}}
{{- define "txbroker.spark.brokers" -}}
{{- .Values.spark.broker.address | default (printf "%s-master.%s.svc:10911" (include "txbroker.spark.brokerName" .) .Release.Namespace) -}}
{{- end -}}

{{/* The TxProducerGroup's metadata.name: the producer group, lower-cased, other characters as "-". */}}
{{- define "txbroker.spark.producerGroupResource" -}}
{{- $n := .Values.spark.producerGroup | lower | replace "_" "-" | replace "%" "-" | replace "|" "-" | trunc 63 | trimAll "-" -}}
{{- $n | default (printf "%s-group" (include "txbroker.spark.name" .)) -}}
{{- end -}}

{{- define "txbroker.spark.dataClaim" -}}
{{- .Values.spark.data.existingClaim | default (printf "%s-data" (include "txbroker.spark.name" .)) -}}
{{- end -}}

{{/* Labels of the Spark objects; pass (dict "ctx" $ "component" "...") */}}
{{- define "txbroker.spark.selectorLabels" -}}
app.kubernetes.io/name: txbroker-spark
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "txbroker.spark.labels" -}}
{{ include "txbroker.spark.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: txbroker
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The application's arguments (spark/jobs/orders_job.py's flags), as a JSON list of strings. */}}
{{- define "txbroker.spark.args" -}}
{{- $s := .Values.spark -}}
{{- $args := list "--brokers" (include "txbroker.spark.brokers" .) "--topic" $s.topic "--group" $s.producerGroup
      "--input" $s.job.input "--output" $s.job.output
      "--orders" (int64 $s.job.orders | toString) "--partitions" (int64 $s.job.partitions | toString)
      "--batch-size" (int64 $s.job.batchSize | toString) "--deadline-seconds" (int64 $s.deadlineSeconds | toString) -}}
{{- range $s.job.extraArgs }}{{ $args = append $args (toString .) }}{{ end -}}
{{- toJson $args -}}
{{- end -}}

{{/* Spark properties set in both forms (the SparkApplication sets cores, memory, instances, the
     service account and the pod templates through its own fields). */}}
{{- define "txbroker.spark.conf" -}}
{{- $conf := dict "spark.pyspark.python" "/opt/venv/bin/python" "spark.pyspark.driver.python" "/opt/venv/bin/python"
      "spark.kubernetes.executor.podTemplateContainerName" "spark-kubernetes-executor"
      "spark.kubernetes.driver.podTemplateContainerName" "spark-kubernetes-driver" -}}
{{- range $k, $v := .Values.spark.job.sparkConf }}{{ $_ := set $conf $k (toString $v) }}{{ end -}}
{{- toJson $conf -}}
{{- end -}}

{{/* The driver's or an executor's pod spec, used as the pod template in both forms; Spark sets the
     image, command, resources and its own volumes on top. Pass (dict "ctx" $ "role" "driver"|"executor"). */}}
{{- define "txbroker.spark.podSpec" -}}
{{- $ := .ctx -}}
{{- $s := $.Values.spark -}}
{{- $driver := eq .role "driver" -}}
{{- if $driver }}
serviceAccountName: {{ include "txbroker.spark.serviceAccountName" $ }}
{{- else }}
# executors never call the API server
automountServiceAccountToken: false
{{- end }}
securityContext:
  {{- toYaml $s.podSecurityContext | nindent 2 }}
{{- with $s.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $s.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $s.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
containers:
  - name: spark-kubernetes-{{ .role }}
    image: {{ include "txbroker.spark.image" $ | quote }}
    securityContext:
      {{- toYaml $s.securityContext | nindent 6 }}
    {{- if $s.data.enabled }}
    volumeMounts:
      - name: txbroker-data
        mountPath: {{ $s.data.mountPath }}
        {{- with $s.data.subPath }}
        subPath: {{ . }}
        {{- end }}
    {{- end }}
{{- if $s.data.enabled }}
volumes:
  - name: txbroker-data
    persistentVolumeClaim:
      claimName: {{ include "txbroker.spark.dataClaim" $ }}
{{- end }}
{{- end -}}
